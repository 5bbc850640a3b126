// SPDX-License-Identifier: Apache-2.0
//! Settings operators carry over from kube-proxy, on the real agent (root; skipped
//! elsewhere): `--healthz-port=0` (no healthz server) runs and serves Services. That an
//! unknown configuration field is a warning naming it, and that the log is klog's, is
//! checked on the binary itself (proxy-agent/tests/cli.rs).

use std::{path::Path, time::Duration};

use tests::scenario::{
    Mode, RunOptions, Scenario, agent::AgentOptions, report::Status, run::check_privileges,
    run::run_scenario,
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

#[tokio::test(flavor = "multi_thread")]
async fn without_a_healthz_server_the_agent_still_serves_services() {
    if let Err(err) = check_privileges() {
        eprintln!("skipping: {err}");
        return;
    }
    let binary = Path::new(RUNNER)
        .parent()
        .map(|dir| dir.join("proxy-agent"))
        .unwrap_or_default();
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/scenarios/c1-clusterip-general.yaml");
    if !binary.is_file() || !file.is_file() {
        eprintln!("skipping: no agent or no shared scenarios");
        return;
    }
    let scenario = Scenario::load(&file).unwrap();
    let agent = AgentOptions {
        proxy: tests::scenario::agent::Proxy::Ours,
        binary,
        mode: Mode::Iptables,
        extra_args: vec!["--healthz-port=0".into(), "--strict-mode".into()],
        config_overrides: Default::default(),
        ready_timeout: Duration::from_secs(30),
    };
    let options = RunOptions::for_agent(agent, RUNNER.into());
    let reports = run_scenario(&options, &scenario, &mut |r| println!("{r}")).await;
    assert!(!reports.is_empty());
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !matches!(r.status, Status::Pass | Status::Skip))
        .map(ToString::to_string)
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
