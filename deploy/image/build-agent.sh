#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The agent image's build steps, in one place: the Dockerfile's build stage runs them, and
# so does `cargo xtask image` on the host (no container engine needed), so that the test
# of the assembled runtime tree exercises what the image runs.
#
#   build-agent.sh toolchain          install the pinned toolchain (Debian bookworm, root):
#                                     what `cargo xtask setup` installs on a developer's
#                                     machine, at the same versions (a test compares them)
#   build-agent.sh build DESTDIR      build the release agent with its eBPF object (required)
#                                     from the checkout this script is in, then `install`
#   build-agent.sh install BINARY DESTDIR
#                                     put an already-built agent where the runtime stage
#                                     takes it (DESTDIR/usr/local/bin/proxy-agent), after
#                                     checking that it runs and embeds the eBPF object
#
# POSIX sh: the build stage has no bash beyond Debian's default.
set -eu

# Pinned versions (the same as xtask/src/setup.rs and ../shared/toolchain.md).
RUST_VERSION=1.95.0
RUST_COMPONENTS="rust-src"
BPF_LINKER_VERSION=0.13.0
LLVM_MAJOR=22
RUSTUP_VERSION=1.29.0
# sha256 of rustup-init $RUSTUP_VERSION, per architecture (static.rust-lang.org's
# rustup/archive/$RUSTUP_VERSION/<triple>/rustup-init.sha256).
RUSTUP_INIT_SHA256_X86_64=4acc9acc76d5079515b46346a485974457b5a79893cfb01112423c89aeb5aa10
RUSTUP_INIT_SHA256_AARCH64=9732d6c5e2a098d3521fca8145d826ae0aaa067ef2385ead08e6feac88fa5792
# Debian packages of the build stage: a C/C++ toolchain (build scripts; bpf-linker links
# LLVM's C++ libraries), and LLVM's development files for bpf-linker (LLVM 22 is rustc
# 1.95's LLVM; xtask/src/setup.rs installs the same).
BUILD_PACKAGES="ca-certificates curl gcc g++ libc6-dev llvm-${LLVM_MAJOR}-dev libpolly-${LLVM_MAJOR}-dev libzstd-dev zlib1g-dev"

# Where the agent goes in the image (the DaemonSet runs this path).
AGENT_PATH=usr/local/bin/proxy-agent

here=$(cd "$(dirname "$0")" && pwd)
workspace=$(cd "$here/../.." && pwd)

say() { printf '==> %s\n' "$*"; }
die() { printf 'build-agent.sh: %s\n' "$*" >&2; exit 1; }

toolchain() {
    say "Debian packages: $BUILD_PACKAGES"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # shellcheck disable=SC2086 # a list of package names
    apt-get install -y -q --no-install-recommends $BUILD_PACKAGES
    rm -rf /var/lib/apt/lists/*

    case "$(uname -m)" in
        x86_64) triple=x86_64-unknown-linux-gnu sum=$RUSTUP_INIT_SHA256_X86_64 ;;
        aarch64) triple=aarch64-unknown-linux-gnu sum=$RUSTUP_INIT_SHA256_AARCH64 ;;
        *) die "no pinned rustup-init for $(uname -m)" ;;
    esac
    say "rustup $RUSTUP_VERSION, Rust $RUST_VERSION (+ $RUST_COMPONENTS)"
    tmp=$(mktemp -d)
    curl --proto '=https' --tlsv1.2 -sSf -o "$tmp/rustup-init" \
        "https://static.rust-lang.org/rustup/archive/$RUSTUP_VERSION/$triple/rustup-init"
    echo "$sum  $tmp/rustup-init" | sha256sum -c -
    chmod +x "$tmp/rustup-init"
    "$tmp/rustup-init" -y -q --no-modify-path --profile minimal \
        --default-toolchain "$RUST_VERSION" --component "$RUST_COMPONENTS"
    rm -rf "$tmp"
    PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

    say "bpf-linker $BPF_LINKER_VERSION against LLVM $LLVM_MAJOR"
    # Its default feature is the next LLVM: it must match rustc's (22), or linking fails
    # with "Invalid record".
    LLVM_PREFIX=/usr/lib/llvm-$LLVM_MAJOR cargo install "bpf-linker@$BPF_LINKER_VERSION" \
        --locked --no-default-features --features "llvm-$LLVM_MAJOR"
    rustc -vV | grep -q "LLVM version: $LLVM_MAJOR\." ||
        die "rustc's LLVM is not $LLVM_MAJOR"
}

build() {
    destdir=$1
    say "the release agent, eBPF object required"
    # PROXY_REQUIRE_EBPF=1: a missing bpf-linker fails the build instead of leaving an
    # agent without ebpf mode.
    (cd "$workspace" &&
        PROXY_REQUIRE_EBPF=1 cargo build --release --locked -p proxy-agent --bin proxy-agent)
    target_dir=${CARGO_TARGET_DIR:-$workspace/target}
    case "$target_dir" in
        /*) ;;
        *) target_dir=$workspace/$target_dir ;;
    esac
    install_agent "$target_dir/release/proxy-agent" "$destdir"
}

# Whether $1 holds a BPF ELF object (an ELF64 little-endian relocatable header with
# e_machine 247 = EM_BPF), as the agent embeds it (proxy-agent/src/ebpf_object.rs).
has_bpf_object() {
    LC_ALL=C grep -qaP '(?s)\x7fELF\x02\x01\x01.{9}\x01\x00\xf7\x00' "$1"
}

install_agent() {
    binary=$1 destdir=$2
    [ -x "$binary" ] || die "no agent at $binary"
    version=$("$binary" --version) || die "$binary --version failed"
    version=$(printf '%s\n' "$version" | head -n 1)
    say "checking $version"
    has_bpf_object "$binary" ||
        die "$binary embeds no eBPF object (built without bpf-linker or with AYA_BUILD_SKIP?)"
    mkdir -p "$destdir/$(dirname "$AGENT_PATH")"
    cp "$binary" "$destdir/$AGENT_PATH"
    chmod 0755 "$destdir/$AGENT_PATH"
    say "installed $destdir/$AGENT_PATH"
}

case "${1:-}" in
    toolchain) toolchain ;;
    build) [ $# -eq 2 ] || die "usage: build-agent.sh build DESTDIR"; build "$2" ;;
    install) [ $# -eq 3 ] || die "usage: build-agent.sh install BINARY DESTDIR"; install_agent "$2" "$3" ;;
    *) die "usage: build-agent.sh toolchain | build DESTDIR | install BINARY DESTDIR" ;;
esac
