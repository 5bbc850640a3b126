// SPDX-License-Identifier: Apache-2.0
fn main() -> anyhow::Result<()> {
    proxy_agent::telemetry::init(0, false);
    match proxy_agent::ebpf_object::unavailable_reason() {
        Some(reason) => tracing::warn!(reason, "ebpf mode unavailable"),
        None => tracing::info!(
            bytes = proxy_agent::ebpf_object::bytes().len(),
            "eBPF object embedded"
        ),
    }
    Ok(())
}
