// SPDX-License-Identifier: Apache-2.0
//! Service -> ServicePort conversion (upstream TestServiceToServiceMap restated, plus every
//! field and the invalid-object rules).

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use crate::k8s::convert::{ClusterObject, parse_objects, service_ports, should_proxy_service};
use crate::k8s::fixtures::mk_service;
use crate::model::{
    IpFamily, LoadBalancerIngress, LoadBalancerIpMode, NamespacedName, ObjectKind, Protocol,
    ServicePort, ServicePortName, SessionAffinity,
};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn ports(svc: &Service, family: IpFamily) -> Vec<(ServicePortName, ServicePort)> {
    service_ports(svc, family).unwrap()
}

fn only_port(svc: &Service, family: IpFamily) -> ServicePort {
    let mut all = ports(svc, family);
    assert_eq!(all.len(), 1, "{all:?}");
    all.remove(0).1
}

fn base(cluster_ip: &str, port: u16, protocol: Protocol) -> ServicePort {
    ServicePort {
        cluster_ip: ip(cluster_ip),
        port,
        protocol,
        node_port: None,
        external_ips: vec![],
        load_balancer_ingress: vec![],
        load_balancer_source_ranges: vec![],
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        session_affinity: None,
        load_balancer_algorithm: None,
    }
}

fn vip(text: &str) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip: ip(text),
        ip_mode: LoadBalancerIpMode::Vip,
    }
}

#[test]
fn services_without_proxying_yield_no_ports() {
    let cases = [
        (
            "headless",
            mk_service("ns2", "headless")
                .headless()
                .port("rpc", 1234, "UDP")
                .build(),
        ),
        (
            "headless sctp",
            mk_service("ns2", "headless")
                .headless()
                .port("sip", 7777, "SCTP")
                .build(),
        ),
        (
            "headless without port",
            mk_service("ns2", "headless-without-port")
                .headless()
                .build(),
        ),
        (
            "external name (clusterIP ignored)",
            mk_service("ns2", "external-name")
                .legacy_cluster_ip("172.16.55.4")
                .external_name("foo2.bar.com")
                .port("portz", 1235, "UDP")
                .build(),
        ),
        (
            "no cluster IP at all",
            mk_service("ns2", "pending").port("p", 80, "TCP").build(),
        ),
        (
            "IPv6 clusterIP under IPv4",
            mk_service("test", "invalidIPv6InIPV4Mode")
                .legacy_cluster_ip("2001:db8:85a3:0:0:8a2e:370:7334")
                .port("testPort", 12345, "TCP")
                .lb_ingress("8.8.8.8", None)
                .build(),
        ),
        (
            "another proxy's service",
            mk_service("ns1", "mine-not")
                .cluster_ip("10.0.0.1")
                .port("p", 80, "TCP")
                .label("service.kubernetes.io/service-proxy-name", "other")
                .build(),
        ),
        (
            "headless label",
            mk_service("ns1", "labelled")
                .cluster_ip("10.0.0.1")
                .port("p", 80, "TCP")
                .label("service.kubernetes.io/headless", "")
                .build(),
        ),
    ];
    for (name, svc) in cases {
        assert_eq!(service_ports(&svc, IpFamily::V4), Ok(vec![]), "{name}");
    }
    let v4_only = mk_service("test", "invalidIPv4InIPV6Mode")
        .legacy_cluster_ip("10.0.0.1")
        .port("testPort", 12345, "TCP")
        .build();
    assert_eq!(service_ports(&v4_only, IpFamily::V6), Ok(vec![]));
}

#[test]
fn proxy_selector_mirrors_kube_proxy_informers() {
    let plain = mk_service("ns", "a").build();
    assert!(should_proxy_service(&plain));
    let other = mk_service("ns", "a")
        .label("service.kubernetes.io/service-proxy-name", "x")
        .build();
    assert!(!should_proxy_service(&other));
    let headless = mk_service("ns", "a")
        .label("service.kubernetes.io/headless", "")
        .build();
    assert!(!should_proxy_service(&headless));
    let unrelated = mk_service("ns", "a").label("app", "web").build();
    assert!(should_proxy_service(&unrelated));
}

#[test]
fn cluster_ip_service() {
    let svc = mk_service("ns2", "cluster-ip")
        .legacy_cluster_ip("172.16.55.4")
        .node_port("p1", 1234, "UDP", 4321)
        .node_port("p2", 1235, "UDP", 5321)
        .build();
    let got = ports(&svc, IpFamily::V4);
    let name = NamespacedName::new("ns2", "cluster-ip");
    let mut p1 = base("172.16.55.4", 1234, Protocol::Udp);
    p1.node_port = Some(4321);
    let mut p2 = base("172.16.55.4", 1235, Protocol::Udp);
    p2.node_port = Some(5321);
    assert_eq!(
        got,
        [
            (ServicePortName::new(name.clone(), "p1", Protocol::Udp), p1),
            (ServicePortName::new(name, "p2", Protocol::Udp), p2),
        ]
    );
}

#[test]
fn node_port_service_with_mixed_protocols() {
    let svc = mk_service("ns2", "node-port")
        .type_("NodePort")
        .legacy_cluster_ip("172.16.55.10")
        .node_port("port1", 345, "UDP", 678)
        .node_port("port2", 344, "TCP", 677)
        .port("port3", 346, "SCTP")
        .build();
    let got = ports(&svc, IpFamily::V4);
    let summary: Vec<_> = got
        .iter()
        .map(|(name, port)| (name.to_string(), name.protocol, port.port, port.node_port))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "ns2/node-port:port1".to_owned(),
                Protocol::Udp,
                345,
                Some(678)
            ),
            (
                "ns2/node-port:port2".to_owned(),
                Protocol::Tcp,
                344,
                Some(677)
            ),
            ("ns2/node-port:port3".to_owned(), Protocol::Sctp, 346, None),
        ]
    );
    assert!(
        got.iter()
            .all(|(_, port)| port.externally_accessible() == port.node_port.is_some())
    );
}

#[test]
fn a_missing_protocol_is_tcp_and_a_missing_port_name_is_empty() {
    let svc = mk_service("ns", "svc")
        .cluster_ip("10.0.0.1")
        .port("x", 80, "TCP")
        .with_last_port(|port| {
            port.protocol = None;
            port.name = None;
        })
        .build();
    let got = ports(&svc, IpFamily::V4);
    assert_eq!(
        got[0].0,
        ServicePortName::new(NamespacedName::new("ns", "svc"), "", Protocol::Tcp)
    );
    assert_eq!(got[0].0.to_string(), "ns/svc");
    assert_eq!(got[0].1.to_string(), "10.0.0.1:80/TCP");
}

#[test]
fn load_balancer_ingress_and_ip_mode() {
    let svc = mk_service("ns1", "load-balancer")
        .type_("LoadBalancer")
        .legacy_cluster_ip("172.16.55.11")
        .node_port("port3", 8675, "UDP", 30061)
        .lb_ingress("10.1.2.4", None)
        .lb_ingress("10.1.2.5", Some("VIP"))
        .lb_ingress("10.1.2.6", Some("Proxy"))
        .lb_ingress("2001:db8::6", Some("VIP"))
        .lb_ingress("010.001.002.007", None)
        .build();
    let port = only_port(&svc, IpFamily::V4);
    assert_eq!(
        port.load_balancer_ingress,
        [
            vip("10.1.2.4"),
            vip("10.1.2.5"),
            LoadBalancerIngress {
                ip: ip("10.1.2.6"),
                ip_mode: LoadBalancerIpMode::Proxy
            },
            vip("10.1.2.7"),
        ]
    );
    // Proxy-mode ingress IPs are not programmed.
    assert_eq!(
        port.load_balancer_vips().collect::<Vec<_>>(),
        [ip("10.1.2.4"), ip("10.1.2.5"), ip("10.1.2.7")]
    );

    let proxy_only = mk_service("ns1", "proxied")
        .type_("LoadBalancer")
        .legacy_cluster_ip("172.16.55.12")
        .port("p", 80, "TCP")
        .lb_ingress("10.1.2.4", Some("Proxy"))
        .build();
    let port = only_port(&proxy_only, IpFamily::V4);
    assert_eq!(port.load_balancer_vips().count(), 0);
    assert!(!port.externally_accessible());
}

#[test]
fn load_balancer_with_local_traffic_policy_has_a_health_check() {
    let svc = mk_service("ns1", "only-local-load-balancer")
        .type_("LoadBalancer")
        .legacy_cluster_ip("172.16.55.12")
        .node_port("portx", 8677, "UDP", 30063)
        .node_port("porty", 8678, "UDP", 30064)
        .lb_ingress("10.1.2.3", None)
        .external_traffic_policy("Local")
        .health_check_node_port(345)
        .build();
    let got = ports(&svc, IpFamily::V4);
    assert_eq!(got.len(), 2);
    for (_, port) in &got {
        assert_eq!(port.health_check_node_port, Some(345));
        assert!(port.external_policy_local);
        assert_eq!(port.load_balancer_ingress, [vip("10.1.2.3")]);
    }
}

#[test]
fn health_check_node_port_only_for_local_load_balancers() {
    let node_port_local = mk_service("ns", "np")
        .type_("NodePort")
        .cluster_ip("10.0.0.1")
        .node_port("p", 80, "TCP", 30080)
        .external_traffic_policy("Local")
        .health_check_node_port(31000)
        .build();
    let port = only_port(&node_port_local, IpFamily::V4);
    assert!(port.external_policy_local);
    assert_eq!(port.health_check_node_port, None);

    let lb_cluster = mk_service("ns", "lb")
        .type_("LoadBalancer")
        .cluster_ip("10.0.0.2")
        .node_port("p", 80, "TCP", 30081)
        .health_check_node_port(31001)
        .build();
    assert_eq!(
        only_port(&lb_cluster, IpFamily::V4).health_check_node_port,
        None
    );

    let lb_local_without_port = mk_service("ns", "lb2")
        .type_("LoadBalancer")
        .cluster_ip("10.0.0.3")
        .node_port("p", 80, "TCP", 30082)
        .external_traffic_policy("Local")
        .build();
    assert_eq!(
        only_port(&lb_local_without_port, IpFamily::V4).health_check_node_port,
        None
    );
}

#[test]
fn external_traffic_policy_needs_external_access() {
    let local = |svc: Service| only_port(&svc, IpFamily::V4).external_policy_local;
    let cluster_ip = mk_service("ns", "a")
        .cluster_ip("10.0.0.1")
        .port("p", 80, "TCP");
    assert!(!local(
        cluster_ip.clone().external_traffic_policy("Local").build()
    ));
    assert!(local(
        cluster_ip
            .clone()
            .external_ips(&["192.168.99.11"])
            .external_traffic_policy("Local")
            .build()
    ));
    assert!(!local(
        cluster_ip.clone().external_ips(&["192.168.99.11"]).build()
    ));
    assert!(local(
        cluster_ip
            .type_("NodePort")
            .external_traffic_policy("Local")
            .build()
    ));
}

#[test]
fn internal_traffic_policy() {
    let svc = |policy: Option<&str>| {
        let builder = mk_service("ns", "a")
            .cluster_ip("10.0.0.1")
            .port("p", 80, "TCP");
        let builder = match policy {
            Some(policy) => builder.internal_traffic_policy(policy),
            None => builder,
        };
        only_port(&builder.build(), IpFamily::V4).internal_policy_local
    };
    assert!(svc(Some("Local")));
    assert!(!svc(Some("Cluster")));
    assert!(!svc(None));
}

#[test]
fn session_affinity() {
    let svc = mk_service("ns", "a")
        .cluster_ip("10.0.0.1")
        .port("p", 80, "TCP");
    assert_eq!(
        only_port(&svc.clone().build(), IpFamily::V4).session_affinity,
        None
    );
    let none = svc
        .clone()
        .with(|s| s.spec.as_mut().unwrap().session_affinity = Some("None".into()));
    assert_eq!(
        only_port(&none.build(), IpFamily::V4).session_affinity,
        None
    );
    let default = svc.clone().session_affinity_client_ip(None).build();
    let affinity = only_port(&default, IpFamily::V4).session_affinity.unwrap();
    assert_eq!(
        affinity,
        SessionAffinity {
            timeout_seconds: 10_800
        }
    );
    assert_eq!(affinity.timeout(), std::time::Duration::from_secs(10_800));
    let explicit = svc.session_affinity_client_ip(Some(60)).build();
    assert_eq!(
        only_port(&explicit, IpFamily::V4).session_affinity,
        Some(SessionAffinity {
            timeout_seconds: 60
        })
    );
}

#[test]
fn addresses_are_filtered_by_family() {
    let svc = |cluster_ip: &str| {
        mk_service("test", "filtered")
            .legacy_cluster_ip(cluster_ip)
            .port("testPort", 12345, "TCP")
            .external_ips(&["8.8.8.8", "2001:db8:85a3:0:0:8a2e:370:7335"])
            .source_ranges(&["0.0.0.0/1", "2001:db8::/32"])
            .lb_ingress("8.8.8.8", None)
            .lb_ingress("2001:db8:85a3:0:0:8a2e:370:7335", None)
            .build()
    };
    let v4 = only_port(&svc("10.0.0.1"), IpFamily::V4);
    assert_eq!(v4.external_ips, [ip("8.8.8.8")]);
    assert_eq!(v4.load_balancer_source_ranges, [net("0.0.0.0/1")]);
    assert_eq!(v4.load_balancer_ingress, [vip("8.8.8.8")]);

    let v6 = only_port(&svc("2001:db8:85a3:0:0:8a2e:370:7334"), IpFamily::V6);
    assert_eq!(v6.cluster_ip, ip("2001:db8:85a3::8a2e:370:7334"));
    assert_eq!(v6.external_ips, [ip("2001:db8:85a3::8a2e:370:7335")]);
    assert_eq!(v6.load_balancer_source_ranges, [net("2001:db8::/32")]);
    assert_eq!(
        v6.load_balancer_ingress,
        [vip("2001:db8:85a3::8a2e:370:7335")]
    );
}

#[test]
fn dual_stack_services_yield_one_port_per_family() {
    let svc = mk_service("ns", "dual")
        .type_("NodePort")
        .cluster_ips(&["fd00::10", "172.30.0.10"])
        .node_port("http", 80, "TCP", 30080)
        .external_ips(&["192.168.99.1", "fd00:99::1"])
        .build();
    let v4 = only_port(&svc, IpFamily::V4);
    let v6 = only_port(&svc, IpFamily::V6);
    assert_eq!(
        (v4.cluster_ip, v4.external_ips.clone()),
        (ip("172.30.0.10"), vec![ip("192.168.99.1")])
    );
    assert_eq!(
        (v6.cluster_ip, v6.external_ips.clone()),
        (ip("fd00::10"), vec![ip("fd00:99::1")])
    );
    assert_eq!((v4.node_port, v6.node_port), (Some(30080), Some(30080)));

    // A service asking for both families but given only one address so far.
    let partial = mk_service("ns", "partial")
        .cluster_ips(&["172.30.0.11"])
        .ip_families(&["IPv4", "IPv6"])
        .port("p", 80, "TCP")
        .build();
    assert_eq!(ports(&partial, IpFamily::V4).len(), 1);
    assert!(ports(&partial, IpFamily::V6).is_empty());
}

#[test]
fn source_ranges_tolerate_whitespace_leading_zeros_and_garbage() {
    let svc = mk_service("test", "extra-space")
        .cluster_ip("10.0.0.1")
        .port("testPort", 12345, "TCP")
        .source_ranges(&[
            " 10.1.2.0/28",
            "203.0.113.000/025\t",
            "10.9.9.9/16",
            "not-a-cidr",
            "  ",
        ])
        .build();
    assert_eq!(
        only_port(&svc, IpFamily::V4).load_balancer_source_ranges,
        [
            net("10.1.2.0/28"),
            net("203.0.113.0/25"),
            net("10.9.0.0/16")
        ]
    );
}

#[test]
fn malformed_external_ips_are_skipped() {
    let svc = mk_service("ns", "a")
        .cluster_ip("10.0.0.1")
        .port("p", 80, "TCP")
        .external_ips(&["", "bogus", "192.168.099.022", " 1.2.3.4"])
        .build();
    assert_eq!(
        only_port(&svc, IpFamily::V4).external_ips,
        [ip("192.168.99.22")]
    );
}

#[test]
fn non_canonical_addresses_from_yaml_are_normalised() {
    // shared/scenarios/l6-non-canonical-ips.yaml
    let yaml = "
apiVersion: v1
kind: Service
metadata: {name: svc1, namespace: ns1}
spec:
  type: LoadBalancer
  clusterIP: 172.30.0.041
  clusterIPs: [172.30.0.041]
  ipFamilies: [IPv4]
  ipFamilyPolicy: SingleStack
  externalIPs: [192.168.099.022]
  ports:
  - {name: p80, port: 80, protocol: TCP, targetPort: 80, nodePort: 3001}
  externalTrafficPolicy: Cluster
  loadBalancerSourceRanges: [203.0.113.000/025]
status:
  loadBalancer:
    ingress:
    - {ip: 1.2.3.004, ipMode: VIP}
";
    let objects: [ClusterObject; 1] = parse_objects(yaml).unwrap().try_into().unwrap();
    let [ClusterObject::Service(svc)] = objects else {
        panic!("one Service expected");
    };
    let port = only_port(&svc, IpFamily::V4);
    assert_eq!(port.cluster_ip, ip("172.30.0.41"));
    assert_eq!(port.external_ips, [ip("192.168.99.22")]);
    assert_eq!(port.load_balancer_source_ranges, [net("203.0.113.0/25")]);
    assert_eq!(port.load_balancer_ingress, [vip("1.2.3.4")]);
    assert_eq!(port.node_port, Some(3001));
}

#[test]
fn invalid_services_are_refused_with_a_reason() {
    let good = || {
        mk_service("ns", "bad")
            .cluster_ip("10.0.0.1")
            .port("p", 80, "TCP")
    };
    let cases: Vec<(&str, Service)> = vec![
        (
            "unparsable clusterIP",
            mk_service("ns", "bad")
                .cluster_ip("10.0.0.x")
                .port("p", 80, "TCP")
                .build(),
        ),
        (
            "port 0",
            mk_service("ns", "bad")
                .cluster_ip("10.0.0.1")
                .port("p", 0, "TCP")
                .build(),
        ),
        (
            "port 70000",
            mk_service("ns", "bad")
                .cluster_ip("10.0.0.1")
                .port("p", 70000, "TCP")
                .build(),
        ),
        (
            "negative nodePort",
            good().node_port("q", 81, "TCP", -1).build(),
        ),
        ("unknown protocol", good().port("q", 81, "tcp").build()),
        ("duplicate port names", good().port("p", 81, "UDP").build()),
        (
            "family mismatch",
            mk_service("ns", "bad")
                .cluster_ips(&["10.0.0.1"])
                .ip_families(&["IPv6"])
                .port("p", 80, "TCP")
                .build(),
        ),
        ("unknown family", good().ip_families(&["IPv5"]).build()),
        (
            "clusterIP is not clusterIPs[0]",
            good()
                .with(|s| s.spec.as_mut().unwrap().cluster_ip = Some("10.0.0.2".into()))
                .build(),
        ),
        ("unknown type", good().type_("Magic").build()),
        (
            "unknown eTP",
            good().external_traffic_policy("Sometimes").build(),
        ),
        (
            "unknown iTP",
            good().internal_traffic_policy("local").build(),
        ),
        (
            "affinity timeout 0",
            good().session_affinity_client_ip(Some(0)).build(),
        ),
        (
            "affinity timeout too long",
            good().session_affinity_client_ip(Some(86_401)).build(),
        ),
        (
            "unknown sessionAffinity",
            good()
                .with(|s| s.spec.as_mut().unwrap().session_affinity = Some("Cookie".into()))
                .build(),
        ),
        (
            "unknown ipMode",
            good().lb_ingress("1.2.3.4", Some("Tunnel")).build(),
        ),
        (
            "health check port out of range",
            good()
                .type_("LoadBalancer")
                .external_traffic_policy("Local")
                .health_check_node_port(65_536)
                .build(),
        ),
        ("no spec", good().with(|s| s.spec = None).build()),
    ];
    for (name, svc) in cases {
        let err = service_ports(&svc, IpFamily::V4).expect_err(name);
        assert_eq!(err.kind, ObjectKind::Service, "{name}");
        assert_eq!(
            (err.namespace.as_str(), err.name.as_str()),
            ("ns", "bad"),
            "{name}"
        );
        assert!(!err.reason.is_empty(), "{name}");
    }
    let nameless = good().with(|s| s.metadata.name = None).build();
    assert!(service_ports(&nameless, IpFamily::V4).is_err());
    // The same object, made valid, converts.
    assert_eq!(ports(&good().build(), IpFamily::V4).len(), 1);
}

#[test]
fn the_lb_algorithm_annotation_chooses_the_algorithm_and_an_unknown_value_is_ignored() {
    use crate::k8s::convert::LB_ALGORITHM_ANNOTATION;
    use crate::model::LoadBalancerAlgorithm;
    let svc = || {
        mk_service("ns", "web")
            .cluster_ip("10.0.0.1")
            .port("http", 80, "TCP")
    };
    assert_eq!(
        only_port(&svc().build(), IpFamily::V4).load_balancer_algorithm,
        None
    );
    for (value, expected) in [
        ("maglev", Some(LoadBalancerAlgorithm::Maglev)),
        (" random ", Some(LoadBalancerAlgorithm::Random)),
        // Warned about, and the configuration decides: the service still converts.
        ("ring-hash", None),
    ] {
        let annotated = svc().annotation(LB_ALGORITHM_ANNOTATION, value).build();
        assert_eq!(
            only_port(&annotated, IpFamily::V4).load_balancer_algorithm,
            expected,
            "{value}"
        );
    }
}

/// A record holds each family it was converted for, once: taking a family's ports moves
/// them out, and a family it was not converted for has none.
#[test]
fn a_service_record_gives_each_family_its_ports_once() {
    use crate::k8s::convert::service_record;
    use crate::model::{NamespacedName, ServicePorts};
    let svc = mk_service("ns1", "web")
        .cluster_ip("10.96.0.10")
        .port("http", 80, "TCP")
        .build();
    let mut record = service_record(&svc, &[IpFamily::V4, IpFamily::V6], false);
    assert_eq!(record.name, NamespacedName::new("ns1", "web"));
    let v4 = record.take_ports(IpFamily::V4).expect("valid");
    let ips: Vec<String> = v4.values().map(|p| p.cluster_ip.to_string()).collect();
    assert_eq!(ips, ["10.96.0.10"]);
    assert_eq!(record.take_ports(IpFamily::V4), Ok(ServicePorts::default()));
    assert_eq!(record.take_ports(IpFamily::V6), Ok(ServicePorts::default()));

    let only_v6 = service_record(&svc, &[IpFamily::V6], false);
    assert_eq!(only_v6.ports.len(), 1);
    let gone = service_record(&svc, &[IpFamily::V4], true);
    assert!(gone.ports.is_empty(), "a deletion needs only the name");
}
