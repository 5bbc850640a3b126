// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask image`: the agent image's runtime stage assembled on the host, without a
//! container engine. deploy/Dockerfile is read, not copied: its runtime stage's `COPY`
//! instructions are reproduced (files of the checkout, and the build stage's output made
//! by the same deploy/image/build-agent.sh the build stage runs), its package `RUN` is
//! recorded with the package list it installs, and its `ENTRYPOINT` must name a file of
//! the tree. An instruction this reproduction does not know fails the task, so the image
//! and the tree cannot drift apart unnoticed.
//!
//! The tree: `DIR/rootfs/` (what the runtime stage adds to its base) and `DIR/image.yaml`
//! (base, entrypoint, the Debian packages the engine would install).
//!
//! The Dockerfile is parsed by hand: the subset it uses (instructions, `\` continuations,
//! comments, `FROM ... AS name`, `COPY [--from=stage] src dest`, a JSON `ENTRYPOINT`) is a
//! few lines, and no maintained crate parses Dockerfiles without pulling in a container
//! engine's client.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use serde::Serialize;

use crate::{
    oci::write_layout,
    util::{run_cmd, step, workspace_root},
};

/// The Dockerfile, the build script and the runtime package list, relative to the root.
pub const DOCKERFILE: &str = "deploy/Dockerfile";
pub const BUILD_SCRIPT: &str = "deploy/image/build-agent.sh";
pub const RUNTIME_PACKAGES: &str = "deploy/image/runtime-packages.txt";

/// One instruction: its keyword (upper case) and the rest of its (joined) line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instruction {
    pub keyword: String,
    pub args: String,
}

/// One stage: its `FROM` image and name, and the instructions after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub from: String,
    pub name: Option<String>,
    pub instructions: Vec<Instruction>,
}

impl Stage {
    pub fn runs(&self) -> impl Iterator<Item = &str> {
        self.instructions
            .iter()
            .filter(|i| i.keyword == "RUN")
            .map(|i| i.args.as_str())
    }
}

/// The stages of a Dockerfile (instructions before the first `FROM`, such as `ARG`, are
/// not supported: the file does not use them).
pub fn parse_dockerfile(text: &str) -> anyhow::Result<Vec<Stage>> {
    let mut stages: Vec<Stage> = Vec::new();
    let mut logical = String::new();
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if logical.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        // Comment lines inside a continued instruction are dropped, as Docker does.
        if trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                logical.push_str(part.trim());
                logical.push(' ');
            }
            None => {
                logical.push_str(trimmed);
                lines.push(std::mem::take(&mut logical));
            }
        }
    }
    if !logical.is_empty() {
        bail!("the Dockerfile ends inside a continued line");
    }
    for line in lines {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.trim().to_string();
        if keyword == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let (from, name) = match words.as_slice() {
                [from] => (from.to_string(), None),
                [from, as_, name] if as_.eq_ignore_ascii_case("as") => {
                    (from.to_string(), Some(name.to_string()))
                }
                _ => bail!("FROM {args}: expected `FROM image [AS name]`"),
            };
            stages.push(Stage {
                from,
                name,
                instructions: Vec::new(),
            });
            continue;
        }
        let Some(stage) = stages.last_mut() else {
            bail!("{keyword} before the first FROM");
        };
        stage.instructions.push(Instruction { keyword, args });
    }
    Ok(stages)
}

/// An image reference pinned by tag and digest: `name:tag@sha256:<64 hex>`.
pub fn is_pinned(image: &str) -> bool {
    let Some((name_tag, digest)) = image.split_once('@') else {
        return false;
    };
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return false;
    };
    let tagged = name_tag
        .rsplit_once(':')
        .is_some_and(|(name, tag)| !name.is_empty() && !tag.is_empty() && !tag.contains('/'));
    tagged
        && hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The package names of a package list (`#` comments, one name a line).
pub fn package_names(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect()
}

/// What a container engine would add on top of the files: recorded in `image.yaml`.
#[derive(Debug, Serialize)]
pub struct ImageConfig {
    pub base: String,
    pub entrypoint: Vec<String>,
    /// Installed by the runtime stage's `RUN` with apt from the list in the tree.
    pub packages: Vec<String>,
}

/// Where the assembled tree lies.
#[derive(Debug)]
pub struct Tree {
    pub rootfs: PathBuf,
    pub config: ImageConfig,
}

/// How the agent gets into the tree.
#[derive(Clone, Debug)]
pub enum Agent {
    /// `build-agent.sh build`: the release build the image's build stage runs.
    Build,
    /// `build-agent.sh install BINARY`: an agent already built (with its eBPF object),
    /// checked and installed by the same script.
    Prebuilt(PathBuf),
}

/// Assembles the runtime stage of `root`'s Dockerfile into `out` (emptied first).
pub fn assemble(root: &Path, out: &Path, agent: &Agent) -> anyhow::Result<Tree> {
    let dockerfile = fs::read_to_string(root.join(DOCKERFILE))
        .with_context(|| format!("reading {DOCKERFILE}"))?;
    let stages = parse_dockerfile(&dockerfile)?;
    let Some((runtime, builders)) = stages.split_last() else {
        bail!("{DOCKERFILE} has no stage");
    };
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("emptying {}", out.display()))?;
    }
    let rootfs = out.join("rootfs");
    fs::create_dir_all(&rootfs).with_context(|| format!("creating {}", rootfs.display()))?;

    let mut entrypoint = None;
    let mut packages = None;
    for instruction in &runtime.instructions {
        let args = instruction.args.as_str();
        match instruction.keyword.as_str() {
            "COPY" => copy(root, &rootfs, builders, args, agent)?,
            "RUN" => {
                // The package install: what it installs is the list it reads.
                let list = package_list_path(args).with_context(|| {
                    format!("the runtime stage's RUN {args}: not the package install")
                })?;
                let text = fs::read_to_string(rootfs.join(list.trim_start_matches('/')))
                    .with_context(|| format!("the RUN reads {list}, not COPY-ed before it"))?;
                packages = Some(package_names(&text));
            }
            "ENTRYPOINT" => {
                let words: Vec<String> = serde_yaml::from_str(args)
                    .with_context(|| format!("ENTRYPOINT {args}: expected a JSON array"))?;
                entrypoint = Some(words);
            }
            other => bail!("the runtime stage's {other} {args} is not reproduced by xtask image"),
        }
    }
    let entrypoint = entrypoint.context("the runtime stage has no ENTRYPOINT")?;
    let program = entrypoint.first().context("an empty ENTRYPOINT")?;
    let in_tree = rootfs.join(program.trim_start_matches('/'));
    let mode = fs::metadata(&in_tree)
        .with_context(|| format!("the ENTRYPOINT {program} is not in the tree"))?
        .permissions()
        .mode();
    if mode & 0o111 == 0 {
        bail!("the ENTRYPOINT {program} is not executable");
    }
    let config = ImageConfig {
        base: runtime.from.clone(),
        entrypoint,
        packages: packages.context("the runtime stage installs no package list")?,
    };
    fs::write(out.join("image.yaml"), serde_yaml::to_string(&config)?)
        .context("writing image.yaml")?;
    Ok(Tree { rootfs, config })
}

/// The package list a `RUN` installs from (`... <list>.txt | xargs apt-get install ...`).
fn package_list_path(run: &str) -> Option<&str> {
    if !run.contains("apt-get install") {
        return None;
    }
    run.split_whitespace()
        .find(|word| word.starts_with('/') && word.ends_with("packages.txt"))
}

/// One `COPY` of the runtime stage, into `rootfs`.
fn copy(
    root: &Path,
    rootfs: &Path,
    builders: &[Stage],
    args: &str,
    agent: &Agent,
) -> anyhow::Result<()> {
    let words: Vec<&str> = args.split_whitespace().collect();
    let (from, rest) = match words.split_first() {
        Some((flag, rest)) if flag.starts_with("--from=") => {
            (Some(flag.trim_start_matches("--from=")), rest)
        }
        _ => (None, words.as_slice()),
    };
    let [src, dest] = rest else {
        bail!("COPY {args}: expected one source and one destination");
    };
    let target = match dest.trim_start_matches('/') {
        "" => rootfs.to_path_buf(),
        relative => rootfs.join(relative),
    };
    match from {
        None => {
            let source = root.join(src);
            if dest.ends_with('/') || source.is_dir() {
                bail!("COPY {args}: only single files are reproduced");
            }
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::copy(&source, &target)
                .with_context(|| format!("COPY {src} -> {}", target.display()))?;
        }
        Some(stage_name) => {
            let stage = builders
                .iter()
                .find(|s| s.name.as_deref() == Some(stage_name))
                .with_context(|| format!("COPY --from={stage_name}: no such stage"))?;
            // The stage's output directory is the DESTDIR of its `build-agent.sh build`.
            let destdir = stage
                .runs()
                .find_map(|run| build_destdir(run))
                .with_context(|| format!("stage {stage_name} does not run {BUILD_SCRIPT} build"))?;
            if src.trim_end_matches('/') != destdir.trim_end_matches('/') {
                bail!("COPY --from={stage_name} {src}: the stage's output is {destdir}");
            }
            fs::create_dir_all(&target)?;
            run_build_script(root, &target, agent)?;
        }
    }
    Ok(())
}

/// The DESTDIR of a `RUN ... build-agent.sh build DESTDIR`.
pub fn build_destdir(run: &str) -> Option<&str> {
    let words: Vec<&str> = run.split_whitespace().collect();
    words
        .windows(3)
        .find(|w| w[0].ends_with("build-agent.sh") && w[1] == "build")
        .map(|w| w[2])
}

/// The shared build script on the host, into `destdir`.
fn run_build_script(root: &Path, destdir: &Path, agent: &Agent) -> anyhow::Result<()> {
    let mut cmd = Command::new("sh");
    cmd.arg(root.join(BUILD_SCRIPT)).current_dir(root);
    match agent {
        Agent::Build => cmd.arg("build"),
        Agent::Prebuilt(binary) => cmd
            .arg("install")
            .arg(std::path::absolute(binary).unwrap_or_else(|_| binary.clone())),
    };
    cmd.arg(destdir);
    // A relative target directory names one below where xtask was started (see
    // util::cargo); the script runs cargo in the workspace root.
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from)
        && dir.is_relative()
        && !dir.as_os_str().is_empty()
        && let Ok(cwd) = std::env::current_dir()
    {
        cmd.env("CARGO_TARGET_DIR", cwd.join(dir));
    }
    run_cmd(&mut cmd)
}

/// What the OCI image's bottom layer is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OciBase {
    /// Debian of the Dockerfile's base (its suite) with the runtime packages, made by
    /// `mmdebstrap` from Debian's archive: the runtime stage as an engine would build it,
    /// from the same release (not the base image's bytes: see docs/image.md).
    Debian,
    /// A root file system tarball made elsewhere.
    Tarball(PathBuf),
    /// No base: the runtime stage's own layer only (not runnable alone; for checks).
    None,
}

/// The Debian suite of a base image reference (`debian:bookworm-slim@sha256:...`).
pub fn debian_suite(base: &str) -> anyhow::Result<String> {
    let name_tag = base.split('@').next().unwrap_or(base);
    let Some(("debian", tag)) = name_tag.rsplit_once(':') else {
        bail!("the base {base} is not a tagged debian image: give --oci-base a tarball");
    };
    Ok(tag.trim_end_matches("-slim").to_string())
}

/// The `mmdebstrap` command making `tarball`: `suite` with `packages`, without what
/// Debian's slim images leave out (documentation, man pages, locales but English) and
/// without apt's lists, as the runtime stage's `RUN` removes them.
pub fn mmdebstrap_command(suite: &str, packages: &[String], tarball: &Path) -> Command {
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--variant=apt", "--format=tar", "--quiet"]);
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    for pattern in [
        "path-exclude=/usr/share/doc/*",
        "path-include=/usr/share/doc/*/copyright",
        "path-exclude=/usr/share/man/*",
        "path-exclude=/usr/share/info/*",
        "path-exclude=/usr/share/locale/*",
        "path-include=/usr/share/locale/locale.alias",
    ] {
        cmd.arg(format!("--dpkgopt={pattern}"));
    }
    cmd.arg("--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/*")
        .arg(suite)
        .arg(tarball);
    cmd
}

/// The image config and layers of `tree` on `base` (a tarball, or none).
pub fn oci_image(tree: &Tree, base: Option<(PathBuf, String)>, tag: &str) -> crate::oci::Image {
    let mut layers = Vec::new();
    if let Some((path, created_by)) = base {
        layers.push(crate::oci::Layer::Tarball { path, created_by });
    }
    layers.push(crate::oci::Layer::Tree {
        dir: tree.rootfs.clone(),
        created_by: format!("{DOCKERFILE}: the runtime stage's COPY instructions"),
    });
    let mut labels = std::collections::BTreeMap::new();
    labels.insert(
        "org.opencontainers.image.title".to_string(),
        "kube-proxy-ebpf".to_string(),
    );
    labels.insert(
        "org.opencontainers.image.version".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    labels.insert(
        "org.opencontainers.image.base.name".to_string(),
        tree.config.base.clone(),
    );
    if let Some(revision) = git_revision() {
        labels.insert("org.opencontainers.image.revision".to_string(), revision);
    }
    crate::oci::Image {
        layers,
        run: crate::oci::RunConfig {
            entrypoint: tree.config.entrypoint.clone(),
            // Debian's images' PATH.
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
            labels,
        },
        tag: tag.to_string(),
    }
}

fn git_revision() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Writes the OCI image layout of `tree` into `out/oci` (see [`crate::oci`]), its base
/// made as `base` says; returns the layout's directory.
pub fn write_oci(out: &Path, tree: &Tree, base: &OciBase, tag: &str) -> anyhow::Result<PathBuf> {
    let base_layer = match base {
        OciBase::None => None,
        OciBase::Tarball(path) => {
            Some((path.clone(), format!("a base tarball ({})", path.display())))
        }
        OciBase::Debian => {
            let suite = debian_suite(&tree.config.base)?;
            let tarball = out.join("base.tar");
            step(&format!(
                "making the base: Debian {suite} with {} (mmdebstrap)",
                tree.config.packages.join(" ")
            ));
            run_cmd(&mut mmdebstrap_command(
                &suite,
                &tree.config.packages,
                &tarball,
            ))
            .context("mmdebstrap (cargo xtask setup installs it)")?;
            Some((
                tarball,
                format!(
                    "mmdebstrap --variant=apt {suite} with {}",
                    tree.config.packages.join(",")
                ),
            ))
        }
    };
    let layout = out.join("oci");
    write_layout(&layout, &oci_image(tree, base_layer, tag))?;
    if let OciBase::Debian = base {
        let _ = fs::remove_file(out.join("base.tar"));
    }
    Ok(layout)
}

/// The task: build (or take) the agent and assemble the tree into `out` (default
/// `target/image` of the workspace's target directory); with `oci`, also its image layout.
pub fn run(out: Option<PathBuf>, agent: &Agent, oci: Option<&OciBase>) -> anyhow::Result<()> {
    let root = workspace_root();
    let out = out.unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .map(|dir| {
                if dir.is_relative() {
                    root.join(dir)
                } else {
                    dir
                }
            })
            .unwrap_or_else(|| root.join("target"))
            .join("image")
    });
    step(&format!(
        "assembling the image's runtime stage into {}",
        out.display()
    ));
    let tree = assemble(&root, &out, agent)?;
    println!(
        "    rootfs {}\n    base {}\n    entrypoint {:?}\n    packages (installed by the engine): {}",
        tree.rootfs.display(),
        tree.config.base,
        tree.config.entrypoint,
        tree.config.packages.join(" ")
    );
    if let Some(base) = oci {
        let layout = write_oci(&out, &tree, base, OCI_TAG)?;
        println!(
            "    OCI image layout {} (tag {OCI_TAG}); push: skopeo copy oci:{}:{OCI_TAG} docker://REGISTRY/kube-proxy-ebpf:TAG",
            layout.display(),
            layout.display()
        );
    }
    Ok(())
}

/// The tag of the image in the layout `--oci` writes.
pub const OCI_TAG: &str = "latest";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_join_continuations_and_skip_comments() {
        let text = "# header\nFROM a:1@sha256:00 AS build\nRUN one \\\n  # inside\n  two\n\n\
                    FROM b:2\nENTRYPOINT [\"/x\"]\n";
        let stages = parse_dockerfile(text).unwrap();
        assert_eq!(stages.len(), 2);
        assert_eq!(stages[0].name.as_deref(), Some("build"));
        assert_eq!(stages[0].runs().collect::<Vec<_>>(), ["one two"]);
        assert_eq!(stages[1].from, "b:2");
        assert_eq!(stages[1].name, None);
        assert!(parse_dockerfile("RUN x\n").is_err());
        assert!(parse_dockerfile("FROM a \\\n").is_err());
    }

    #[test]
    fn pinned_means_tag_and_digest() {
        let digest = "sha256:abd67ffcfa541b485a3dff59865ab629aa048a6c613e639d36e7456b0b229241";
        assert!(is_pinned(&format!("debian:bookworm-slim@{digest}")));
        assert!(is_pinned(&format!(
            "registry:5000/debian:bookworm-slim@{digest}"
        )));
        assert!(!is_pinned("debian:bookworm-slim"));
        assert!(!is_pinned(&format!("debian@{digest}")));
        assert!(!is_pinned(&format!("registry:5000/debian@{digest}")));
        assert!(!is_pinned("debian:bookworm-slim@sha256:abc"));
    }

    #[test]
    fn package_lists_and_the_build_output() {
        assert_eq!(
            package_names("# c\niptables\n\n ipset # sets\n"),
            ["iptables", "ipset"]
        );
        assert_eq!(
            build_destdir("CARGO_TARGET_DIR=/t sh deploy/image/build-agent.sh build /out"),
            Some("/out")
        );
        assert_eq!(build_destdir("sh build-agent.sh toolchain"), None);
        assert_eq!(
            package_list_path(
                "apt-get update && sed x /usr/share/p/runtime-packages.txt | xargs apt-get install -y"
            ),
            Some("/usr/share/p/runtime-packages.txt")
        );
    }
}
