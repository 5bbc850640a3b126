// SPDX-License-Identifier: Apache-2.0
//! The agent image (deploy/Dockerfile) without a container engine: every base is pinned
//! by tag and digest; the build stage runs the shared build script
//! (deploy/image/build-agent.sh) with the toolchain versions `cargo xtask setup` installs;
//! the runtime stage installs the netfilter tools from the one package list; and the
//! runtime stage assembled by `cargo xtask image`'s code holds an agent, at the
//! ENTRYPOINT's path, that runs and embeds the eBPF object.
//!
//! Kept cheap: the tree is assembled from the agent this test run already built (the
//! script's `install` step, which its `build` step ends with, checks and installs it), not
//! from a second, release build; the script's cargo command line is checked as text.
//! `cargo xtask image` without `--agent-binary` runs the release build itself.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use xtask::image::{self, Agent, Stage};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn stages() -> Vec<Stage> {
    image::parse_dockerfile(&read(image::DOCKERFILE)).unwrap()
}

/// `NAME=value` assignments at the start of a line of the build script.
fn script_settings() -> HashMap<String, String> {
    read(image::BUILD_SCRIPT)
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
        })
        .map(|(name, value)| (name.to_string(), value.trim_matches('"').to_string()))
        .collect()
}

/// The string value of `const NAME: &str = "...";` in xtask/src/setup.rs.
fn setup_const(name: &str) -> String {
    let setup = read("xtask/src/setup.rs");
    let prefix = format!("const {name}: &str = \"");
    let start = setup
        .find(&prefix)
        .unwrap_or_else(|| panic!("setup.rs has no {name}"))
        + prefix.len();
    setup[start..].split('"').next().unwrap().to_string()
}

#[test]
fn every_base_is_pinned_by_tag_and_digest() {
    let stages = stages();
    assert!(stages.len() >= 2, "a build stage and a runtime stage");
    for stage in &stages {
        assert!(
            image::is_pinned(&stage.from),
            "FROM {} is not pinned as name:tag@sha256:<digest>",
            stage.from
        );
    }
}

#[test]
fn the_runtime_stage_installs_the_netfilter_tools_from_the_one_list() {
    let stages = stages();
    let runtime = stages.last().unwrap();
    let list = image::package_names(&read(image::RUNTIME_PACKAGES));
    for tool in ["iptables", "ipset", "nftables", "conntrack", "kmod"] {
        assert!(
            list.iter().any(|p| p == tool),
            "{tool} missing from {list:?}"
        );
    }
    // The stage copies that file in and installs what it lists, nothing else.
    let copy = runtime
        .instructions
        .iter()
        .find(|i| i.keyword == "COPY" && i.args.starts_with(image::RUNTIME_PACKAGES))
        .expect("the runtime stage copies the package list");
    let in_image = copy.args.split_whitespace().nth(1).unwrap();
    let installs: Vec<&str> = runtime
        .runs()
        .filter(|run| run.contains("apt-get install"))
        .collect();
    assert_eq!(installs.len(), 1, "{installs:?}");
    assert!(installs[0].contains(in_image), "{}", installs[0]);
    assert!(installs[0].contains("--no-install-recommends"));
}

#[test]
fn the_build_stage_runs_the_shared_script_with_setups_versions() {
    let stages = stages();
    let (runtime, builders) = stages.split_last().unwrap();
    let build = builders
        .iter()
        .find(|s| s.runs().any(|run| image::build_destdir(run).is_some()))
        .expect("a stage runs build-agent.sh build");
    let runs: Vec<&str> = build.runs().collect();
    assert!(
        runs.iter().any(|r| r.contains("build-agent.sh toolchain")),
        "{runs:?}"
    );
    assert!(
        build
            .instructions
            .iter()
            .any(|i| i.keyword == "COPY" && i.args.starts_with(image::BUILD_SCRIPT)),
        "the build stage runs the checkout's script"
    );
    // The runtime stage takes that stage's output.
    let destdir = runs.iter().find_map(|r| image::build_destdir(r)).unwrap();
    let name = build.name.as_deref().expect("the build stage is named");
    assert!(
        runtime.instructions.iter().any(|i| i.keyword == "COPY"
            && i.args.starts_with(&format!("--from={name} {destdir}"))),
        "the runtime stage copies {destdir} from {name}"
    );

    // The toolchain is `cargo xtask setup`'s.
    let script = script_settings();
    assert_eq!(
        script["BPF_LINKER_VERSION"],
        setup_const("BPF_LINKER_VERSION")
    );
    assert_eq!(
        format!("/usr/lib/llvm-{}", script["LLVM_MAJOR"]),
        setup_const("LLVM_PREFIX")
    );
    let workspace = read("Cargo.toml");
    let rust_version = workspace
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the workspace's rust-version");
    assert!(
        script["RUST_VERSION"].starts_with(&format!("{rust_version}.")),
        "the image builds with Rust {}, the workspace needs {rust_version}",
        script["RUST_VERSION"]
    );
    assert!(read("xtask/src/setup.rs").contains(&format!("\"{}\"", script["RUST_COMPONENTS"])));
    // The build: release, the lock file, the eBPF object required.
    let text = read(image::BUILD_SCRIPT);
    assert!(
        text.contains("PROXY_REQUIRE_EBPF=1 cargo build --release --locked -p proxy-agent"),
        "the script's cargo build changed"
    );
}

/// Whether `binary` holds an eBPF ELF object: an ELF64 little-endian relocatable header
/// with e_machine EM_BPF, as the agent embeds it (checked here independently of the
/// script's own check).
fn embeds_bpf_object(binary: &[u8]) -> bool {
    binary.windows(20).any(|w| {
        w[..7] == *b"\x7fELF\x02\x01\x01"
            && u16::from_le_bytes([w[16], w[17]]) == 1
            && u16::from_le_bytes([w[18], w[19]]) == proxy_agent::ebpf_object::EM_BPF
    })
}

#[test]
fn the_assembled_runtime_tree_runs_and_embeds_the_ebpf_object() {
    // The agent this run built (target/debug/proxy-agent beside the test binary).
    let agent = tests::node_harness::TestNode::agent_binary();
    assert!(
        agent.is_file(),
        "{} is not built (cargo build -p proxy-agent)",
        agent.display()
    );
    let built = fs::read(&agent).unwrap();
    if !embeds_bpf_object(&built) {
        assert_ne!(
            std::env::var("PROXY_REQUIRE_EBPF").as_deref(),
            Ok("1"),
            "the eBPF object is required but {} has none",
            agent.display()
        );
        eprintln!("SKIP: this build carries no eBPF object (built without bpf-linker)");
        return;
    }
    let out = std::env::temp_dir().join(format!("kpe-image-{}", std::process::id()));
    let tree = image::assemble(&root(), &out, &Agent::Prebuilt(agent.clone())).unwrap();

    // The ENTRYPOINT is the agent, where the DaemonSet runs it.
    assert_eq!(tree.config.entrypoint, ["/usr/local/bin/proxy-agent"]);
    let installed = tree.rootfs.join("usr/local/bin/proxy-agent");
    let mode = fs::metadata(&installed).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    let bytes = fs::read(&installed).unwrap();
    assert_eq!(bytes, built, "the tree's agent is the built one");
    assert!(embeds_bpf_object(&bytes));
    let version = Command::new(&installed).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert!(
        String::from_utf8_lossy(&version.stdout).starts_with("proxy-agent "),
        "{}",
        String::from_utf8_lossy(&version.stdout)
    );
    // The package list the image installs is in the tree and recorded.
    let list = fs::read_to_string(
        tree.rootfs
            .join("usr/share/kube-proxy-ebpf/runtime-packages.txt"),
    )
    .unwrap();
    assert_eq!(list, read(image::RUNTIME_PACKAGES));
    assert_eq!(tree.config.packages, image::package_names(&list));
    assert!(image::is_pinned(&tree.config.base));
    let recorded = fs::read_to_string(out.join("image.yaml")).unwrap();
    assert!(
        recorded.contains("- /usr/local/bin/proxy-agent"),
        "{recorded}"
    );
    // Nothing else: the runtime stage adds only these two files.
    let mut files = Vec::new();
    let mut dirs = vec![tree.rootfs.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(
                    path.strip_prefix(&tree.rootfs)
                        .unwrap()
                        .display()
                        .to_string(),
                );
            }
        }
    }
    files.sort();
    assert_eq!(
        files,
        [
            "usr/local/bin/proxy-agent",
            "usr/share/kube-proxy-ebpf/runtime-packages.txt"
        ]
    );
    fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_binary_without_the_ebpf_object_is_refused() {
    // The script's check, on a binary that certainly has none.
    let out = std::env::temp_dir().join(format!("kpe-image-refused-{}", std::process::id()));
    let refused = image::assemble(&root(), &out, &Agent::Prebuilt(PathBuf::from("/bin/true")));
    assert!(refused.is_err());
    assert!(!out.join("rootfs/usr/local/bin/proxy-agent").exists());
    let _ = fs::remove_dir_all(&out);
}

/// The tree as `cargo xtask image --oci` writes its image: an OCI layout that skopeo (an
/// OCI tool from Debian's packages) reads and copies, digests checked; its config runs the
/// Dockerfile's ENTRYPOINT; its top layer holds exactly the runtime stage's files, the
/// agent byte for byte; the base is its bottom layer (here a small tarball made by the
/// test: the Debian base mmdebstrap makes needs the network, see docs/image.md).
#[test]
fn the_oci_image_is_read_by_skopeo_and_holds_the_runtime_tree() {
    let agent = tests::node_harness::TestNode::agent_binary();
    assert!(agent.is_file(), "{} is not built", agent.display());
    if !embeds_bpf_object(&fs::read(&agent).unwrap()) {
        eprintln!("SKIP: this build carries no eBPF object (the install step refuses it)");
        return;
    }
    let out = std::env::temp_dir().join(format!("kpe-image-oci-{}", std::process::id()));
    let tree = image::assemble(&root(), &out, &Agent::Prebuilt(agent.clone())).unwrap();
    let base_dir = out.join("base");
    fs::create_dir_all(base_dir.join("etc")).unwrap();
    fs::write(base_dir.join("etc/os-release"), "ID=test-base\n").unwrap();
    let base = out.join("base.tar");
    let status = Command::new("tar")
        .args(["-C", &base_dir.display().to_string(), "-cf"])
        .arg(&base)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
    let layout = image::write_oci(
        &out,
        &tree,
        &image::OciBase::Tarball(base.clone()),
        image::OCI_TAG,
    )
    .unwrap();

    let skopeo = |args: &[&str]| {
        let output = Command::new("skopeo")
            .args(args)
            .output()
            .unwrap_or_else(|e| {
                panic!("skopeo: {e} (cargo xtask setup installs it)");
            });
        assert!(
            output.status.success(),
            "skopeo {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap_or_default()
    };
    let reference = format!("oci:{}:{}", layout.display(), image::OCI_TAG);
    let inspected = skopeo(&["inspect", &reference]);
    assert_eq!(inspected["Os"], "linux");
    assert_eq!(inspected["Layers"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        inspected["Labels"]["org.opencontainers.image.base.name"],
        tree.config.base.as_str()
    );
    let config = skopeo(&["inspect", "--config", &reference]);
    let runtime = stages().pop().unwrap();
    let entrypoint = runtime
        .instructions
        .iter()
        .find(|i| i.keyword == "ENTRYPOINT")
        .unwrap();
    let dockerfile_entrypoint: Vec<String> = serde_json::from_str(&entrypoint.args).unwrap();
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(dockerfile_entrypoint),
        "the Dockerfile's ENTRYPOINT"
    );
    assert_eq!(
        config["rootfs"]["diff_ids"], inspected["Layers"],
        "uncompressed layers: digests are diff ids"
    );
    // Copying checks every blob against its digest.
    let copied = out.join("copied");
    skopeo(&[
        "copy",
        "--quiet",
        &reference,
        &format!("dir:{}", copied.display()),
    ]);
    assert!(copied.join("manifest.json").is_file());
    let _ = fs::remove_dir_all(&copied);

    // Layers bottom up: the base, then exactly the runtime stage's files.
    let images = xtask::oci::read_layout(&layout).unwrap();
    let [(_, manifest, _)] = images.as_slice() else {
        panic!("one image in the layout");
    };
    let files = |layer: &xtask::oci::Descriptor| -> Vec<(String, Vec<u8>, u32)> {
        let blob = xtask::oci::checked_blob(&layout, layer).unwrap();
        let mut archive = tar::Archive::new(blob.as_slice());
        archive
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .filter(|e| e.header().entry_type().is_file())
            .map(|mut e| {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut bytes).unwrap();
                let path = e.path().unwrap().display().to_string();
                let path = path.trim_start_matches("./").to_string();
                (path, bytes, e.header().mode().unwrap() & 0o777)
            })
            .collect()
    };
    let base_files = files(&manifest.layers[0]);
    assert_eq!(base_files.len(), 1);
    assert_eq!(base_files[0].0, "etc/os-release");
    let top = files(&manifest.layers[1]);
    let names: Vec<&str> = top.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(
        names,
        [
            "usr/local/bin/proxy-agent",
            "usr/share/kube-proxy-ebpf/runtime-packages.txt"
        ]
    );
    assert_eq!(top[0].1, fs::read(&agent).unwrap(), "the built agent");
    assert_eq!(top[0].2, 0o755, "executable");
    assert_eq!(
        String::from_utf8_lossy(&top[1].1),
        read(image::RUNTIME_PACKAGES)
    );
    fs::remove_dir_all(&out).unwrap();
}
