// SPDX-License-Identifier: Apache-2.0
//! Where upstream's binaries are: built by `k8s/build.sh` (run by `cargo xtask setup`) into
//! `target/k8s-testbed/` of the workspace, or wherever `KPE_K8S_BIN_DIR` says.

use std::path::{Path, PathBuf};

/// Overrides the directory the binaries are taken from.
pub const BIN_DIR_ENV: &str = "KPE_K8S_BIN_DIR";

/// The components `k8s/build.sh` builds, by file name.
pub const COMPONENTS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-proxy",
    "kubeadm",
];

#[derive(Debug, thiserror::Error)]
pub enum BinariesError {
    #[error(
        "upstream's {missing} is not built in {dir} (run `cargo xtask setup`, which builds \
         etcd, kube-apiserver, kube-controller-manager, kube-proxy and kubeadm from \
         testbed/k8s)"
    )]
    Missing { missing: String, dir: PathBuf },
}

/// The workspace's root directory (this crate sits one below it): the checkout cargo
/// runs this in (`CARGO_MANIFEST_DIR` of the running test or task), else the one it was
/// compiled in.
pub fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// The Go module that builds the binaries.
pub fn go_module_dir() -> PathBuf {
    workspace_root().join("testbed/k8s")
}

/// The directory the binaries are built into by default.
pub fn default_dir() -> PathBuf {
    workspace_root().join("target/k8s-testbed")
}

#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The built binaries, every component present.
    pub fn locate() -> Result<Self, BinariesError> {
        let dir = std::env::var_os(BIN_DIR_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(default_dir);
        Self::in_dir(&dir)
    }

    pub fn in_dir(dir: &Path) -> Result<Self, BinariesError> {
        for name in COMPONENTS {
            if !dir.join(name).is_file() {
                return Err(BinariesError::Missing {
                    missing: (*name).to_string(),
                    dir: dir.to_path_buf(),
                });
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }

    pub fn kube_controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }

    pub fn kube_proxy(&self) -> PathBuf {
        self.dir.join("kube-proxy")
    }

    pub fn kubeadm(&self) -> PathBuf {
        self.dir.join("kubeadm")
    }

    /// The upstream release they were built from (`VERSION`, written by build.sh).
    pub fn version(&self) -> String {
        std::fs::read_to_string(self.dir.join("VERSION"))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    }
}
