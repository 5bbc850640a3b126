// SPDX-License-Identifier: Apache-2.0
//! The nftables mode's groundwork (issue 17): the pure heart of the mode, not registered
//! yet. What is here: one family's desired ruleset for `table ip kube-proxy` /
//! `table ip6 kube-proxy` as `nft -f` text ([`DesiredState`], [`base`], [`port_rules`]),
//! and the record of what was written with the full and partial transactions that move
//! the kernel to a new desired state ([`Written`]); the operator tools on the live table
//! ([`trace`]: `trace` follows a connection through `nft -j`'s listing, `inspect rules`
//! prints it). What comes next, in the registration step: the `mode.rs` entry in the
//! registry, applying the texts with `nft -f -` on stdin, the fallback to iptables,
//! cleanup of the other modes' leftovers, metrics, and the scenario suites.
//!
//! # Behaviour
//!
//! Upstream's nftables proxier (pkg/proxy/nftables), from the same inputs as the iptables
//! mode: the model's service ports and endpoints, categorised by the shared model code
//! (topology, traffic policies, terminating fallback). Base chains and priorities,
//! `service-ips` / `service-nodeports` dispatch verdict maps, the `cluster-ips` set,
//! `no-endpoint-services` / `no-endpoint-nodeports` (REJECT through `reject-chain`, DROP
//! for a Local policy without local endpoint), `cluster-ips-check` (REJECT for ports a live
//! ClusterIP does not serve, DROP for unallocated addresses in the ServiceCIDRs),
//! `firewall-ips` for loadBalancerSourceRanges (admitting the node's own address and the
//! LB IPs as upstream does), the masquerade mark and `masquerade fully-random`,
//! masqueradeAll and the local-traffic detector, external chains with the eTP=Local
//! short-circuits, nodePortAddresses (the `nodeport-ips` set, or `fib daddr type local`
//! and never loopback), ClientIP affinity, hairpin masquerade, DNAT. Chain names are
//! upstream's (`service-<hash>-ns/name/tcp/port`, `endpoint-<hash>-...__ip/port`).
//!
//! # Shape: same packets, no per-service sets
//!
//! The kernel finds a set by walking the table's list of sets, and every anonymous set
//! needs a fresh name found the same way; upstream binds one anonymous verdict map per
//! service (`numgen random mod N vmap { 0 : goto ..., ... }`) and one named affinity set
//! per endpoint of a ClientIP service, so a cold load grows with the square of the
//! services (measured here: 23–84 s for 10,000 services × 4 endpoints). Chains, by
//! contrast, are found through a hash table. So here the number of set objects is fixed
//! (the six shared maps and sets, `nodeport-ips`, one `affinity` set, one anonymous set
//! for the ServiceCIDRs):
//!
//! - **Endpoint choice** is a cascade of rules in the policy chain, `numgen random mod
//!   (N-i) == 0 goto endpoint-i` for i = 0..N-2 and a final `goto endpoint-(N-1)`; each
//!   endpoint gets exactly 1/N (proof at `dispatch` in ruleset.rs, checked over the
//!   generated rules by a unit test). It costs up to N-1 random draws per new connection
//!   instead of one map lookup; NAT rules only see a connection's first packet.
//! - **ClientIP affinity** uses ONE dynamic set per family, keyed `client address .
//!   endpoint slot`, with a per-element timeout: the endpoint chain does `update
//!   @affinity { ip saddr . <slot> timeout <s>s }`, the policy chain looks up `ip saddr .
//!   <slot> @affinity goto <endpoint chain>` for each endpoint before the cascade, as
//!   upstream looks up its per-endpoint sets. The slot is 32 bits of the hash of the
//!   endpoint chain's name (service port and endpoint address), so it is deterministic and
//!   affinity survives an agent restart, as upstream's sets do; it is written as
//!   `numgen random mod 1 offset <slot>` because nft cannot type a literal inside a
//!   key concatenation (`mod 1` is always 0, so the expression is the constant). A slot
//!   shared by two endpoints (a 32-bit hash collision) can only make a client stick to an
//!   endpoint of the right service that it did not pick: the lookup happens in that
//!   service's own chain. Entries of removed endpoints expire by their timeout rather
//!   than with a set deletion. The set is bounded at [`AFFINITY_SET_SIZE`] entries (the
//!   kernel's default for a dynamic set, 65,535, is upstream's bound per endpoint).
//! - **loadBalancerSourceRanges** are one `return` rule per range in the firewall chain,
//!   then `drop`, instead of an anonymous set per service.
//! - Map elements are written in one statement per map (one netlink batch).
//!
//! # Transactions
//!
//! [`Written`] keeps what was written (the element storage of upstream's proxier, and
//! each service port's chains): a full sync rewrites every chain and refills the maps
//! (flushed in the same transaction); a partial sync rewrites only the changed service
//! ports' chains and writes element adds and deletes. Chains no longer used are flushed
//! at once and deleted by a later transaction after [`STALE_CHAIN_DELAY`].
//!
//! Everything is text for `nft -f`, written by hand: it is the input upstream's
//! transport (knftables, a Go library, feeding the `nft` binary) produces, one atomic
//! transaction per text, and the kernel tests load it with the real binary. Whether the
//! registered mode feeds `nft` on stdin or speaks netlink is decided at registration.

mod context;
mod names;
mod ruleset;
mod state;
#[cfg(test)]
mod tests;
pub mod trace;

pub use context::NftContext;
pub use names::{PortNames, affinity_slot, is_port_chain};
pub use ruleset::{
    AFFINITY_SET_SIZE, Chain, Container, DesiredState, Element, ElementValue, Model, PortRules,
    base, port_rules,
};
pub use state::{STALE_CHAIN_DELAY, TransactionStats, Written};
