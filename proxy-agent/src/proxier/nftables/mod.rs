// SPDX-License-Identifier: Apache-2.0
//! The nftables dataplane (`--proxy-mode nftables`): upstream kube-proxy's nftables mode,
//! table `ip kube-proxy` / `ip6 kube-proxy`, with a ruleset shaped so that loading it does
//! not grow with the square of the services.
//!
//! - `ruleset` renders one family's desired state as `nft -f` text ([`DesiredState`],
//!   [`base`], [`port_rules`]; pure, golden-tested);
//! - `state` ([`Written`]) records what was written and builds the full and partial
//!   transactions that move the kernel to a new desired state;
//! - `proxier` ([`NftablesProxier`]) runs one transaction per family and sync through
//!   `transport` (`nft -f -`), deletes stale chains a second later, notices a flushed
//!   table, and reconciles stale UDP conntrack entries after the rules;
//! - `mode` registers it (probe, fallback to iptables, cleanup of its tables, tools);
//! - `trace` answers `trace` and `inspect` from the live table (`nft -j` listing).
//!
//! # Behaviour
//!
//! Upstream's nftables proxier (pkg/proxy/nftables), from the same inputs as the iptables
//! mode: the model's service ports and endpoints, categorised by the shared model code
//! (topology, traffic policies, terminating fallback). Base chains and priorities,
//! `service-ips` / `service-nodeports` dispatch verdict maps, the `cluster-ips` set,
//! `no-endpoint-services` / `no-endpoint-nodeports` (REJECT through `reject-chain`, DROP
//! for a Local policy without local endpoint; the eTP=Local DROP of external IPs and LB
//! IPs sits in a map of its own, `no-local-endpoint-external`, checked in input and
//! forward only: upstream checks it in output too, before the external chain's
//! short-circuit for this node's own traffic could apply, so the node could not reach
//! such a service; here it can, as in iptables mode and as the shared scenarios expect), `cluster-ips-check` (REJECT for ports a live
//! ClusterIP does not serve, DROP for unallocated addresses in the ServiceCIDRs),
//! `firewall-ips` for loadBalancerSourceRanges (admitting the node's own address and the
//! LB IPs as upstream does), the masquerade mark and `masquerade fully-random`,
//! masqueradeAll and the local-traffic detector, external chains with the eTP=Local
//! short-circuits, nodePortAddresses (the `nodeport-ips` set, or `fib daddr type local`
//! and never loopback), ClientIP affinity, hairpin masquerade, DNAT. Chain names are
//! upstream's (`service-<hash>-ns/name/tcp/port`, and `endpoint-<hash>-...__ip/port` for
//! services with ClientIP affinity).
//!
//! # Shape: same packets, no per-service sets, few chains
//!
//! The kernel finds a set by walking the table's list of sets, and every anonymous set
//! needs a fresh name found the same way; upstream binds one anonymous verdict map per
//! service (`numgen random mod N vmap { 0 : goto ..., ... }`) and one named affinity set
//! per endpoint of a ClientIP service, so a cold load grows with the square of the
//! services (measured here: 23–84 s for 10,000 services × 4 endpoints). And `nft` 1.0.x
//! lists every chain of the table before any transaction that adds a rule or an element
//! (4 s for the 225,000 chains of 50,000 services × 4 endpoints in upstream's shape, most
//! of them endpoint chains), so the chain count sets the floor of every partial sync.
//! So here the number of set objects is fixed (the seven shared maps and sets,
//! `nodeport-ips`, one `affinity` set, `hairpin-endpoints`, the slot maps, one anonymous
//! set for the ServiceCIDRs) and a service without affinity has no endpoint chain:
//!
//! - **Endpoint choice** (no affinity) is one rule in the policy chain: `meta l4proto tcp
//!   dnat ip to <hi> . <lo> . numgen random mod N map @endpoint-slots-tcp-<b>`, where
//!   `<hi> . <lo>` (62 bits) and the bucket `<b>` come from the hash of the chain's name
//!   (`names::SlotKey`) and the map holds `<hi> . <lo> . i : address . port` for the N
//!   endpoints: one draw, each endpoint 1/N. 256 maps per protocol rather than one: the
//!   kernel walks a map's bindings (its rules) for every element added, so one shared
//!   map would cost services × endpoints at a cold load; 256 keep it at about 1/256 of
//!   that. `hairpin-endpoints` (`endpoint . endpoint`) replaces upstream's per-endpoint
//!   `ip saddr <endpoint> jump mark-for-masquerade`: postrouting marks a DNATed
//!   connection whose source is its destination. Upstream's per-service rule masquerading
//!   off-cluster traffic to the ClusterIP is one rule of `services` over `@cluster-ips`.
//! - **With ClientIP affinity** a service keeps upstream's endpoint chains (the affinity
//!   entry names one), chosen by a cascade of rules in the policy chain, `numgen random
//!   mod (N-i) == 0 goto endpoint-i` for i = 0..N-2 and a final `goto endpoint-(N-1)`;
//!   each endpoint gets exactly 1/N (proof at `dispatch` in ruleset.rs, checked over the
//!   generated rules by a unit test).
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
pub(super) mod mode;
mod names;
mod proxier;
mod ruleset;
mod state;
#[cfg(test)]
mod tests;
mod trace;
mod transport;

pub use context::NftContext;
pub use names::{PortNames, affinity_slot, is_port_chain};
pub use proxier::{Error, MODE, NftablesProxier};
pub use ruleset::{
    AFFINITY_SET_SIZE, Chain, Container, DesiredState, Element, ElementValue, Model, PortRules,
    base, port_rules,
};
pub use state::{STALE_CHAIN_DELAY, TransactionStats, Written};
pub use transport::{NftCommand, NftTransport, family_keyword, nft};
