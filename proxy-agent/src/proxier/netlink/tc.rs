// SPDX-License-Identifier: Apache-2.0
//! rtnetlink for what the ebpf mode leaves on devices outside its pins: BPF filters on a
//! clsact qdisc (tc on kernels without TCX) and XDP programs attached through netlink.
//! Listing them (with the program id and the name the attacher gave) and removing one;
//! which of them are ours is the ebpf mode's business (`proxier::ebpf::attached`).
//!
//! aya attaches such filters but only finds them again by the name given at attach time,
//! per device and direction; the sweep over every device of the namespace, with the
//! program ids the kernel reports, is this module's.

use netlink_packet_route::link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached};
use netlink_packet_route::tc::{
    TcAttribute, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use nix::errno::Errno;

use super::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, NetlinkMessage, NetlinkSocket, request,
};

type RouteRequest = NetlinkMessage<RouteNetlinkMessage>;

/// The two hooks of a clsact qdisc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClsactHook {
    Ingress,
    Egress,
}

impl ClsactHook {
    pub const BOTH: [ClsactHook; 2] = [ClsactHook::Ingress, ClsactHook::Egress];

    /// The filter parent: `ffff:fff2` (ingress) or `ffff:fff3` (egress).
    fn parent(self) -> TcHandle {
        TcHandle {
            major: TcHandle::CLSACT.major,
            minor: match self {
                ClsactHook::Ingress => TcHandle::MIN_INGRESS,
                ClsactHook::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ClsactHook::Ingress => "ingress",
            ClsactHook::Egress => "egress",
        }
    }
}

/// One BPF filter on a clsact hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpfFilter {
    pub ifindex: u32,
    pub hook: ClsactHook,
    /// The filter's priority (`pref`) and handle: together they name it on its hook.
    pub priority: u16,
    pub handle: u32,
    /// The protocol the filter matches (network byte order, as the kernel keeps it).
    pub protocol: u16,
    /// TCA_BPF_NAME: what the attacher called it (aya: the program's name).
    pub name: Option<String>,
    /// TCA_BPF_ID (4.13+): the attached program.
    pub prog_id: Option<u32>,
}

/// One link of the namespace, with the XDP program attached to it through netlink or a
/// bpf_link (the kernel reports both alike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkXdpState {
    pub ifindex: u32,
    pub name: String,
    /// (program id, XDP_FLAGS_* mode it runs in) for each program attached.
    pub programs: Vec<(u32, u32)>,
}

/// XDP_FLAGS_SKB_MODE, XDP_FLAGS_DRV_MODE, XDP_FLAGS_HW_MODE (linux/if_link.h).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
pub const XDP_FLAGS_HW_MODE: u32 = 1 << 3;

fn filters_request(ifindex: u32, hook: ClsactHook) -> RouteRequest {
    let mut message = TcMessage::with_index(ifindex as i32);
    message.header.family = AddressFamily::Unspec;
    message.header.parent = hook.parent();
    request(
        NLM_F_REQUEST | NLM_F_DUMP,
        RouteNetlinkMessage::GetTrafficFilter(message),
    )
}

/// Deletes exactly one filter: its priority, protocol and handle (a handle of 0 would
/// delete every filter of that priority).
fn delete_filter_request(filter: &BpfFilter) -> RouteRequest {
    let message = TcMessage::from_parts(
        TcHeader {
            family: AddressFamily::Unspec,
            index: filter.ifindex as i32,
            handle: TcHandle::from(filter.handle),
            parent: filter.hook.parent(),
            info: (u32::from(filter.priority) << 16) | u32::from(filter.protocol),
        },
        vec![TcAttribute::Kind("bpf".into())],
    );
    request(
        NLM_F_REQUEST | NLM_F_ACK,
        RouteNetlinkMessage::DelTrafficFilter(message),
    )
}

fn links_request() -> RouteRequest {
    request(
        NLM_F_REQUEST | NLM_F_DUMP,
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )
}

/// Detaches the XDP program running in `mode` (XDP_FLAGS_*) from link `ifindex`.
fn detach_xdp_request(ifindex: u32, mode: u32) -> RouteRequest {
    let mut link = LinkMessage::default();
    link.header.index = ifindex;
    link.attributes.push(LinkAttribute::Xdp(vec![
        LinkXdp::Fd(-1),
        LinkXdp::Flags(mode),
    ]));
    request(
        NLM_F_REQUEST | NLM_F_ACK,
        RouteNetlinkMessage::SetLink(link),
    )
}

/// The BPF filter of one RTM_NEWTFILTER message, `None` for anything else (another
/// classifier, or the per-priority entry without a handle that dumps also carry).
pub fn parse_filter(message: &TcMessage, hook: ClsactHook) -> Option<BpfFilter> {
    let is_bpf = message
        .attributes
        .iter()
        .any(|a| matches!(a, TcAttribute::Kind(kind) if kind == "bpf"));
    let handle = u32::from(message.header.handle);
    if !is_bpf || handle == 0 {
        return None;
    }
    let mut filter = BpfFilter {
        ifindex: u32::try_from(message.header.index).ok()?,
        hook,
        priority: (message.header.info >> 16) as u16,
        handle,
        protocol: (message.header.info & 0xffff) as u16,
        name: None,
        prog_id: None,
    };
    let options = message.attributes.iter().filter_map(|a| match a {
        TcAttribute::Options(options) => Some(options),
        _ => None,
    });
    for option in options.flatten() {
        match option {
            TcOption::Bpf(TcFilterBpfOption::ProgName(name)) => filter.name = Some(name.clone()),
            TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => filter.prog_id = Some(*id),
            _ => {}
        }
    }
    Some(filter)
}

/// The XDP state of one RTM_NEWLINK message.
pub fn parse_link_xdp(link: &LinkMessage) -> LinkXdpState {
    let mut state = LinkXdpState {
        ifindex: link.header.index,
        name: String::new(),
        programs: Vec::new(),
    };
    let mut attached = None;
    let mut single = None;
    for attribute in &link.attributes {
        match attribute {
            LinkAttribute::IfName(name) => state.name = name.clone(),
            LinkAttribute::Xdp(xdp) => {
                for item in xdp {
                    match item {
                        LinkXdp::Attached(mode) => attached = Some(*mode),
                        LinkXdp::ProgId(id) => single = Some(*id),
                        LinkXdp::SkbProgId(id) => state.programs.push((*id, XDP_FLAGS_SKB_MODE)),
                        LinkXdp::DrvProgId(id) => state.programs.push((*id, XDP_FLAGS_DRV_MODE)),
                        LinkXdp::HwProgId(id) => state.programs.push((*id, XDP_FLAGS_HW_MODE)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    // With one program the kernel sends IFLA_XDP_PROG_ID and the mode in
    // IFLA_XDP_ATTACHED; with several (XDP_ATTACHED_MULTI) one id per mode.
    if state.programs.is_empty()
        && let Some(id) = single.filter(|id| *id != 0)
    {
        let mode = match attached {
            Some(XdpAttached::Driver) => XDP_FLAGS_DRV_MODE,
            Some(XdpAttached::Hardware) => XDP_FLAGS_HW_MODE,
            _ => XDP_FLAGS_SKB_MODE,
        };
        state.programs.push((id, mode));
    }
    state
}

/// Listing and removing BPF filters and netlink XDP programs in the caller's namespace.
#[derive(Debug)]
pub struct TcSocket {
    socket: NetlinkSocket,
}

impl TcSocket {
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_ROUTE)?,
        })
    }

    /// Every link with its XDP programs.
    pub fn links(&mut self) -> Result<Vec<LinkXdpState>, NetlinkError> {
        let answers = self.socket.request(links_request(), "list links")?;
        Ok(answers
            .iter()
            .filter_map(|answer| match answer {
                RouteNetlinkMessage::NewLink(link) => Some(parse_link_xdp(link)),
                _ => None,
            })
            .collect())
    }

    /// The BPF filters on `hook` of link `ifindex` (none without a clsact qdisc).
    pub fn bpf_filters(
        &mut self,
        ifindex: u32,
        hook: ClsactHook,
    ) -> Result<Vec<BpfFilter>, NetlinkError> {
        match self
            .socket
            .request(filters_request(ifindex, hook), "list tc filters")
        {
            Ok(answers) => Ok(answers
                .iter()
                .filter_map(|answer| match answer {
                    RouteNetlinkMessage::NewTrafficFilter(message) => parse_filter(message, hook),
                    _ => None,
                })
                .collect()),
            // No qdisc to hold filters, or the link went away meanwhile.
            Err(err)
                if matches!(
                    err.errno(),
                    Some(Errno::EINVAL | Errno::ENODEV | Errno::ENOENT)
                ) =>
            {
                Ok(Vec::new())
            }
            Err(err) => Err(err),
        }
    }

    /// Deletes one filter (already gone is fine).
    pub fn delete_filter(&mut self, filter: &BpfFilter) -> Result<(), NetlinkError> {
        match self
            .socket
            .request(delete_filter_request(filter), "delete tc filter")
        {
            Err(err) if !matches!(err.errno(), Some(Errno::ENOENT | Errno::ENODEV)) => Err(err),
            _ => Ok(()),
        }
    }

    /// Detaches the XDP program running in `mode` on link `ifindex`. The kernel refuses
    /// (EBUSY) a program held by a bpf_link: that one goes with its link.
    pub fn detach_xdp(&mut self, ifindex: u32, mode: u32) -> Result<(), NetlinkError> {
        match self
            .socket
            .request(detach_xdp_request(ifindex, mode), "detach xdp")
        {
            Err(err) if err.errno() != Some(Errno::ENODEV) => Err(err),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::netlink::encode;
    use crate::proxier::netlink::socket::{Received, split_datagram};

    fn round_trip(mut message: RouteRequest) -> RouteNetlinkMessage {
        match split_datagram(&encode(&mut message, 1)).unwrap().pop() {
            Some(Received::Data(answer)) => answer,
            other => panic!("{other:?}"),
        }
    }

    fn filter() -> BpfFilter {
        BpfFilter {
            ifindex: 7,
            hook: ClsactHook::Egress,
            priority: 0x2b50,
            handle: 0x4b50,
            protocol: 0x0300,
            name: None,
            prog_id: None,
        }
    }

    #[test]
    fn a_filter_dump_asks_for_one_hook_of_one_link() {
        let RouteNetlinkMessage::GetTrafficFilter(message) =
            round_trip(filters_request(7, ClsactHook::Ingress))
        else {
            panic!()
        };
        assert_eq!(message.header.index, 7);
        assert_eq!(u32::from(message.header.parent), 0xffff_fff2);
        assert_eq!(u32::from(ClsactHook::Egress.parent()), 0xffff_fff3);
    }

    #[test]
    fn deleting_names_priority_protocol_and_handle() {
        let RouteNetlinkMessage::DelTrafficFilter(message) =
            round_trip(delete_filter_request(&filter()))
        else {
            panic!()
        };
        assert_eq!(message.header.index, 7);
        assert_eq!(u32::from(message.header.parent), 0xffff_fff3);
        assert_eq!(message.header.info, 0x2b50_0300);
        assert_eq!(u32::from(message.header.handle), 0x4b50);
        assert!(
            message
                .attributes
                .contains(&TcAttribute::Kind("bpf".into()))
        );
    }

    #[test]
    fn a_bpf_filter_is_read_with_its_name_and_program() {
        let mut message = TcMessage::from_parts(
            TcHeader {
                index: 7,
                handle: TcHandle::from(0x4b50),
                parent: ClsactHook::Ingress.parent(),
                info: 0x2b50_0300,
                ..Default::default()
            },
            vec![
                TcAttribute::Kind("bpf".into()),
                TcAttribute::Options(vec![
                    TcOption::Bpf(TcFilterBpfOption::ProgName("tc_uplink_ingress".into())),
                    TcOption::Bpf(TcFilterBpfOption::ProgId(42)),
                ]),
            ],
        );
        let parsed = parse_filter(&message, ClsactHook::Ingress).unwrap();
        assert_eq!(
            parsed,
            BpfFilter {
                hook: ClsactHook::Ingress,
                name: Some("tc_uplink_ingress".into()),
                prog_id: Some(42),
                ..filter()
            }
        );
        // The per-priority entry of a dump has no handle; another classifier is not ours.
        message.header.handle = TcHandle::from(0);
        assert_eq!(parse_filter(&message, ClsactHook::Ingress), None);
        message.header.handle = TcHandle::from(1);
        message.attributes[0] = TcAttribute::Kind("u32".into());
        assert_eq!(parse_filter(&message, ClsactHook::Ingress), None);
    }

    #[test]
    fn xdp_programs_are_read_per_mode() {
        let mut link = LinkMessage::default();
        link.header.index = 3;
        link.attributes.push(LinkAttribute::IfName("up0".into()));
        link.attributes.push(LinkAttribute::Xdp(vec![
            LinkXdp::Attached(XdpAttached::SocketBuffer),
            LinkXdp::ProgId(12),
        ]));
        assert_eq!(
            parse_link_xdp(&link),
            LinkXdpState {
                ifindex: 3,
                name: "up0".into(),
                programs: vec![(12, XDP_FLAGS_SKB_MODE)],
            }
        );
        link.attributes[1] = LinkAttribute::Xdp(vec![
            LinkXdp::Attached(XdpAttached::Multiple),
            LinkXdp::SkbProgId(12),
            LinkXdp::DrvProgId(13),
        ]);
        assert_eq!(
            parse_link_xdp(&link).programs,
            vec![(12, XDP_FLAGS_SKB_MODE), (13, XDP_FLAGS_DRV_MODE)]
        );
        let RouteNetlinkMessage::SetLink(set) =
            round_trip(detach_xdp_request(3, XDP_FLAGS_SKB_MODE))
        else {
            panic!()
        };
        assert_eq!(set.header.index, 3);
        assert_eq!(
            set.attributes,
            vec![LinkAttribute::Xdp(vec![
                LinkXdp::Fd(-1),
                LinkXdp::Flags(XDP_FLAGS_SKB_MODE)
            ])]
        );
    }
}
