// SPDX-License-Identifier: Apache-2.0
//! An OCI image layout (image-spec 1.1: `oci-layout`, `index.json`, `blobs/sha256/`) written
//! from directory trees and layer tarballs, without a container engine: what `cargo xtask
//! image --oci` makes of the assembled runtime tree, for `skopeo copy oci:DIR:TAG
//! docker://REGISTRY/...` to push.
//!
//! Layers are stored uncompressed (`application/vnd.oci.image.layer.v1.tar`, which the spec
//! allows; `skopeo copy` to a registry compresses them on the way out), so a layer's digest
//! is also its diff id. A tree's tarball is deterministic: entries in name order, owned by
//! root, no timestamps, no sparse entries, so the same tree gives the same digest.
//!
//! The documents are a few JSON objects written with serde; tarballs come from the `tar`
//! crate and digests from `sha2`. No maintained crate writes an image layout from a directory
//! without also bringing a registry client or a container runtime.

use std::{
    fs,
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// The annotation naming a manifest in an index: the `TAG` of `oci:DIR:TAG`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A blob of the layout: what a manifest or an index points at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// What the image runs, as a container engine reads it (the `config` of the image config).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConfig {
    #[serde(rename = "Entrypoint")]
    pub entrypoint: Vec<String>,
    #[serde(rename = "Env")]
    pub env: Vec<String>,
    #[serde(rename = "Labels")]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ImageConfigFile {
    pub architecture: String,
    pub os: String,
    pub config: RunConfig,
    pub rootfs: RootFs,
    pub history: Vec<History>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct History {
    pub created_by: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Index {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub manifests: Vec<Descriptor>,
}

/// One layer to write: a tree (tarred here) or a tarball made elsewhere (a base system),
/// with the line the image's history gives it.
#[derive(Clone, Debug)]
pub enum Layer {
    Tree { dir: PathBuf, created_by: String },
    Tarball { path: PathBuf, created_by: String },
}

/// The image: its layers bottom up, what it runs, and the tag it gets in the index.
#[derive(Clone, Debug)]
pub struct Image {
    pub layers: Vec<Layer>,
    pub run: RunConfig,
    pub tag: String,
}

/// The image config's `architecture` for this build's target (Go's names, as the spec's).
pub fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// Writes `image` as an image layout into `out` (emptied first); returns the manifest's
/// descriptor (as the index lists it).
pub fn write_layout(out: &Path, image: &Image) -> anyhow::Result<Descriptor> {
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("emptying {}", out.display()))?;
    }
    let blobs = out.join("blobs/sha256");
    fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    let mut layers = Vec::new();
    let mut history = Vec::new();
    for layer in &image.layers {
        let (descriptor, created_by) = match layer {
            Layer::Tree { dir, created_by } => (tar_tree_blob(&blobs, dir)?, created_by),
            Layer::Tarball { path, created_by } => (file_blob(&blobs, path)?, created_by),
        };
        layers.push(descriptor);
        history.push(History {
            created_by: created_by.clone(),
        });
    }
    let config = ImageConfigFile {
        architecture: architecture().to_string(),
        os: "linux".into(),
        config: image.run.clone(),
        rootfs: RootFs {
            kind: "layers".into(),
            // Uncompressed layers: the diff id is the layer's digest.
            diff_ids: layers.iter().map(|l| l.digest.clone()).collect(),
        },
        history,
    };
    let config = json_blob(&blobs, CONFIG_MEDIA_TYPE, &config)?;
    let manifest = Manifest {
        schema_version: 2,
        media_type: MANIFEST_MEDIA_TYPE.into(),
        config,
        layers,
    };
    let mut manifest = json_blob(&blobs, MANIFEST_MEDIA_TYPE, &manifest)?;
    manifest
        .annotations
        .insert(REF_NAME.into(), image.tag.clone());
    let index = Index {
        schema_version: 2,
        media_type: INDEX_MEDIA_TYPE.into(),
        manifests: vec![manifest.clone()],
    };
    fs::write(out.join("index.json"), serde_json::to_vec(&index)?).context("writing index.json")?;
    fs::write(out.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .context("writing oci-layout")?;
    Ok(manifest)
}

/// Stores `bytes` as a blob.
fn bytes_blob(blobs: &Path, media_type: &str, bytes: &[u8]) -> anyhow::Result<Descriptor> {
    let digest = format!("sha256:{:x}", Sha256::digest(bytes));
    let path = blobs.join(digest.trim_start_matches("sha256:"));
    fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(Descriptor {
        media_type: media_type.into(),
        digest,
        size: bytes.len() as u64,
        annotations: Default::default(),
    })
}

fn json_blob<T: Serialize>(
    blobs: &Path,
    media_type: &str,
    value: &T,
) -> anyhow::Result<Descriptor> {
    bytes_blob(blobs, media_type, &serde_json::to_vec(value)?)
}

/// Copies the tarball at `path` into the blobs, hashing it on the way.
fn file_blob(blobs: &Path, path: &Path) -> anyhow::Result<Descriptor> {
    let mut input =
        fs::File::open(path).with_context(|| format!("opening layer {}", path.display()))?;
    let partial = blobs.join(".partial");
    let mut output = HashingWriter::new(fs::File::create(&partial)?);
    io::copy(&mut input, &mut output).with_context(|| format!("copying {}", path.display()))?;
    output.into_blob(blobs, &partial)
}

/// Tars `dir` (its contents at the layer's root) into the blobs.
fn tar_tree_blob(blobs: &Path, dir: &Path) -> anyhow::Result<Descriptor> {
    let partial = blobs.join(".partial");
    let mut builder = tar::Builder::new(HashingWriter::new(fs::File::create(&partial)?));
    builder.mode(tar::HeaderMode::Deterministic);
    builder.follow_symlinks(false);
    // Holes written out: a GNU sparse entry is no regular file to every reader of layers.
    builder.sparse(false);
    append_sorted(&mut builder, dir, Path::new(""))?;
    let output = builder
        .into_inner()
        .context("finishing the layer's tarball")?;
    output.into_blob(blobs, &partial)
}

/// Appends `dir`'s entries under `prefix`, in name order, directories before their contents.
fn append_sorted<W: io::Write>(
    builder: &mut tar::Builder<W>,
    dir: &Path,
    prefix: &Path,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = prefix.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            builder
                .append_dir(&name, &path)
                .with_context(|| format!("adding {}", path.display()))?;
            append_sorted(builder, &path, &name)?;
        } else if kind.is_file() || kind.is_symlink() {
            builder
                .append_path_with_name(&path, &name)
                .with_context(|| format!("adding {}", path.display()))?;
        } else {
            bail!(
                "{}: only files, directories and symlinks go into a layer",
                path.display()
            );
        }
    }
    Ok(())
}

/// A writer that hashes what it writes.
struct HashingWriter<W> {
    inner: W,
    hash: Sha256,
    size: u64,
}

impl<W: io::Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
            size: 0,
        }
    }
}

impl HashingWriter<fs::File> {
    /// Flushes the file written at `partial` and moves it to its digest's name.
    fn into_blob(mut self, blobs: &Path, partial: &Path) -> anyhow::Result<Descriptor> {
        self.inner.flush()?;
        self.inner.sync_all()?;
        let digest = format!("sha256:{:x}", self.hash.finalize());
        fs::rename(partial, blobs.join(digest.trim_start_matches("sha256:")))
            .context("naming the layer's blob")?;
        Ok(Descriptor {
            media_type: LAYER_MEDIA_TYPE.into(),
            digest,
            size: self.size,
            annotations: Default::default(),
        })
    }
}

impl<W: io::Write> io::Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hash.update(&buf[..written]);
        self.size += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The layout at `dir` read back: its index's manifests, each with its manifest and config,
/// every blob checked against its digest and size.
pub fn read_layout(dir: &Path) -> anyhow::Result<Vec<(Descriptor, Manifest, ImageConfigFile)>> {
    let layout: serde_json::Value = serde_json::from_slice(&fs::read(dir.join("oci-layout"))?)?;
    if layout["imageLayoutVersion"] != "1.0.0" {
        bail!("oci-layout: {layout}");
    }
    let index: Index = serde_json::from_slice(&fs::read(dir.join("index.json"))?)?;
    let mut images = Vec::new();
    for descriptor in index.manifests {
        let manifest: Manifest = serde_json::from_slice(&checked_blob(dir, &descriptor)?)?;
        let config: ImageConfigFile =
            serde_json::from_slice(&checked_blob(dir, &manifest.config)?)?;
        for layer in &manifest.layers {
            checked_blob(dir, layer)?;
        }
        images.push((descriptor, manifest, config));
    }
    Ok(images)
}

/// A blob's bytes, after checking its size and digest.
pub fn checked_blob(dir: &Path, descriptor: &Descriptor) -> anyhow::Result<Vec<u8>> {
    let Some(hex) = descriptor.digest.strip_prefix("sha256:") else {
        bail!("{}: not a sha256 digest", descriptor.digest);
    };
    let path = dir.join("blobs/sha256").join(hex);
    let mut bytes = Vec::new();
    fs::File::open(&path)
        .with_context(|| format!("blob {}", descriptor.digest))?
        .read_to_end(&mut bytes)?;
    let actual = format!("{:x}", Sha256::digest(&bytes));
    if actual != hex || bytes.len() as u64 != descriptor.size {
        bail!(
            "blob {}: {} bytes with digest sha256:{actual}, the descriptor says {} bytes",
            descriptor.digest,
            bytes.len(),
            descriptor.size
        );
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) -> PathBuf {
        let dir = root.join("tree");
        fs::create_dir_all(dir.join("usr/local/bin")).unwrap();
        fs::write(dir.join("usr/local/bin/agent"), b"#!/bin/sh\n").unwrap();
        fs::write(dir.join("b"), b"b").unwrap();
        fs::write(dir.join("a"), b"a").unwrap();
        dir
    }

    fn image(dir: &Path) -> Image {
        Image {
            layers: vec![Layer::Tree {
                dir: dir.to_path_buf(),
                created_by: "COPY".into(),
            }],
            run: RunConfig {
                entrypoint: vec!["/usr/local/bin/agent".into()],
                env: vec!["PATH=/usr/bin".into()],
                labels: Default::default(),
            },
            tag: "test".into(),
        }
    }

    #[test]
    fn a_layout_reads_back_with_every_digest_right() {
        let root = std::env::temp_dir().join(format!("xtask-oci-{}", std::process::id()));
        let dir = tree(&root);
        let out = root.join("oci");
        let manifest = write_layout(&out, &image(&dir)).unwrap();
        assert_eq!(manifest.annotations[REF_NAME], "test");
        let images = read_layout(&out).unwrap();
        let [(descriptor, manifest, config)] = images.as_slice() else {
            panic!("one image: {images:?}");
        };
        assert_eq!(descriptor.media_type, MANIFEST_MEDIA_TYPE);
        assert_eq!(manifest.layers.len(), 1);
        assert_eq!(config.rootfs.diff_ids, [manifest.layers[0].digest.clone()]);
        assert_eq!(config.config.entrypoint, ["/usr/local/bin/agent"]);
        assert_eq!(config.os, "linux");

        // The layer: the tree's entries in name order, owned by root, the mode kept.
        let layer = checked_blob(&out, &manifest.layers[0]).unwrap();
        let mut archive = tar::Archive::new(layer.as_slice());
        let names: Vec<(String, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().uid().unwrap(),
                )
            })
            .collect();
        let paths: Vec<&str> = names.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "a",
                "b",
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/agent"
            ]
        );
        assert!(names.iter().all(|(_, uid)| *uid == 0));

        // The same tree, the same image.
        let again = write_layout(&root.join("oci2"), &image(&dir)).unwrap();
        assert_eq!(again.digest, descriptor.digest);

        // A blob changed on disk is caught.
        let hex = manifest.layers[0].digest.trim_start_matches("sha256:");
        fs::write(out.join("blobs/sha256").join(hex), b"changed").unwrap();
        assert!(read_layout(&out).is_err());
        let _ = fs::remove_dir_all(&root);
    }
}
