// SPDX-License-Identifier: Apache-2.0
//! Builds the eBPF object (proxy-ebpf) with aya-build and leaves it in OUT_DIR for
//! `include_bytes!`. Where the eBPF toolchain (bpf-linker) is missing, or AYA_BUILD_SKIP is
//! set, an empty object is written instead so that the host crates still build and test; the
//! agent then reports ebpf mode as unavailable. `PROXY_REQUIRE_EBPF=1` (set by
//! `cargo xtask test` and CI) turns a missing toolchain into a build failure.
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, bail};

const OBJECT_NAME: &str = "proxy-ebpf";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PROXY_REQUIRE_EBPF");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let object = out_dir.join(OBJECT_NAME);
    let required = env::var("PROXY_REQUIRE_EBPF").is_ok_and(|v| v == "1");

    let skip_reason = if env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v == "true") {
        Some("AYA_BUILD_SKIP is set".to_string())
    } else if which::which("bpf-linker").is_err() {
        Some("bpf-linker is not installed (run `cargo xtask setup`)".to_string())
    } else {
        None
    };
    if let Some(reason) = skip_reason {
        if required {
            bail!("the eBPF object is required (PROXY_REQUIRE_EBPF=1) but {reason}");
        }
        println!("cargo:warning=eBPF object not built: {reason}; ebpf mode will be unavailable");
        fs::write(&object, []).context("writing the empty eBPF object")?;
        return Ok(());
    }

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("no manifest dir")?);
    let ebpf_dir = manifest_dir.join("..").join("proxy-ebpf");
    let ebpf_dir = ebpf_dir.canonicalize().context("locating proxy-ebpf")?;
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 path to proxy-ebpf")?;
    // The nested eBPF build needs `-Z build-std=core`. RUSTC_BOOTSTRAP=1 allows it on the
    // stable toolchain, and it only reaches the nested cargo invocation (a build script's
    // environment is its own).
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    // A build dir shared between worktrees (CARGO_BUILD_BUILD_DIR) would reach the nested
    // cargo too, which then waits for the outer release build's lock on that directory for
    // ever. The nested build keeps its own directory under OUT_DIR instead.
    // SAFETY: as above.
    unsafe { env::remove_var("CARGO_BUILD_BUILD_DIR") };
    let toolchain = env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "stable".to_string());
    let package = aya_build::Package {
        name: "proxy-ebpf",
        root_dir: ebpf_dir,
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(&toolchain))
        .context("building the eBPF programs")?;
    if fs::metadata(&object).map(|m| m.len()).unwrap_or(0) == 0 {
        bail!(
            "aya-build finished but left no object at {}",
            object.display()
        );
    }
    Ok(())
}
