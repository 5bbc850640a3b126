// SPDX-License-Identifier: Apache-2.0
//! What the iptables-based modes share (iptables and ipvs mode; the nftables mode takes
//! the chain-name hash):
//!
//! - `exec` finds the iptables binaries (nft or legacy variant, version) and runs
//!   `iptables`, `iptables-save` and `iptables-restore` behind [`IptablesBackend`];
//!   `host_backend` picks the backend the host's rules are in when both are installed;
//! - `save` is the one reader of iptables text (save output, restore input, `-S`
//!   listings) with its one tokenizer; proxiers, cleanup, `inspect rules` and `trace` use it;
//! - `jumps` writes and recognises the rules hooking a mode's chains into the built-in
//!   chains; `cleanup` removes chains and the rules jumping to them; `matches` writes
//!   the local-traffic match and the masquerade mark;
//! - `names` holds the chain names upstream's proxiers share and upstream's SHA-256 chain
//!   name hash; `table` the tables;
//! - `nfacct` creates and reads the named accounting counters iptables rules feed with
//!   `-m nfacct` (iptables mode's upstream metrics).

pub(super) mod cleanup;
pub(super) mod exec;
pub mod host_backend;
pub(super) mod inspect;
pub(super) mod jumps;
pub(super) mod matches;
pub(super) mod names;
pub(super) mod nfacct;
pub(super) mod save;
pub(super) mod table;

pub use exec::{CommandBackend, ExecError, IptablesBackend, Variant, Version};
pub use jumps::Jump;
pub use table::Table;
