// SPDX-License-Identifier: Apache-2.0
//! Which services go into the maps when not all of them fit, and in what order.
//!
//! Services that have entries in the maps come first, so that nothing programmed is ever
//! pushed out by a newcomer; then the others, by family and name, so that the same cluster
//! always gets the same choice. Each service is admitted whole or refused whole: a refused
//! service writes nothing, and what it had in the maps stays as it was (stale, but
//! consistent: every slot 0 still points at slots and backends that exist). A restarted
//! agent reads what its predecessor programmed back from the maps, so it keeps the same
//! services and never deletes one it cannot fit any more.

use std::collections::BTreeSet;

use proxy_common::{SCOPE_EXTERNAL, SCOPE_INTERNAL, SvcValue};
use tracing::debug;

use super::{AppliedService, ApplyState, BackendFlags, Plan, v6};
use crate::{
    model::{FamilyState, IpFamily, NamespacedName},
    parallel,
    proxier::{
        FullMap, NodeContext,
        ebpf::{
            budget::{Budget, Demand, MapKind, PerMap},
            desired::{BackendAddr, DesiredService, desired_service},
            entries::{Snapshot, SvcEntryKey},
            ids::Exhausted,
        },
    },
};

/// How many refused services the report names.
const EXAMPLES: usize = 5;
/// Below this many services to look at, what they should have is worked out on the
/// calling thread.
const PARALLEL_DESIRED_MIN: usize = 4_096;

/// One service of one family to bring in line.
pub(super) struct Candidate {
    family: IpFamily,
    service: NamespacedName,
    desired: DesiredService,
    /// What it has in the maps now.
    old: AppliedService,
}

impl Candidate {
    /// `family/namespace/name`.
    #[cfg(test)]
    pub(super) fn label(&self) -> String {
        format!("{:?}/{}", self.family, self.service)
    }

    /// What it should have, and what it has in the maps now.
    pub(super) fn desired_and_old(&self) -> (&DesiredService, &AppliedService) {
        (&self.desired, &self.old)
    }

    /// About the entries it adds to each budgeted map of its family: what it should have
    /// beyond what it has (a backend it shares with another service is counted here too;
    /// entries it keeps, or replaces by as many new ones, are not).
    pub(super) fn added_entries(&self) -> [(MapKind, IpFamily, usize); 4] {
        let (desired, old) = (&self.desired, &self.old);
        let scopes: usize = desired
            .frontends
            .iter()
            .map(|f| 1 + usize::from(f.internal.is_some()))
            .sum();
        let svc_entries = desired.backend_slots() + scopes + desired.wildcards.len();
        let src_ranges: usize = desired
            .frontends
            .iter()
            .map(|f| f.source_ranges.len())
            .sum();
        [
            (MapKind::Services, svc_entries.saturating_sub(old.svc.len())),
            (
                MapKind::Backends,
                distinct_backends(desired).saturating_sub(old.backends.len()),
            ),
            (
                MapKind::RevNat,
                desired.frontends.len().saturating_sub(old.frontends.len()),
            ),
            (
                MapKind::SourceRanges,
                src_ranges.saturating_sub(old.src_ranges.len()),
            ),
        ]
        .map(|(kind, n)| (kind, self.family, n))
    }
}

/// How many different backends a service's slots point at: its frontends (ClusterIP,
/// NodePort, load balancer IPs of one port) and scopes share them.
fn distinct_backends(desired: &DesiredService) -> usize {
    match desired.frontends.as_slice() {
        [] => 0,
        // The common case, without a copy: within a scope each backend is there once.
        [only] if only.internal.is_none() => only.external.backends.len(),
        frontends => {
            let mut addrs: Vec<_> = frontends
                .iter()
                .flat_map(|f| {
                    let internal = f.internal.iter().flat_map(|s| &s.backends);
                    f.external.backends.iter().chain(internal)
                })
                .map(|b| b.addr)
                .collect();
            addrs.sort_unstable();
            addrs.dedup();
            addrs.len()
        }
    }
}

/// The services one sync refused and the maps that had no room for them.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    pub services: BTreeSet<(IpFamily, NamespacedName)>,
    maps: BTreeSet<(MapKind, IpFamily)>,
}

impl Refusals {
    fn add(&mut self, family: IpFamily, service: NamespacedName, short: Vec<MapKind>) {
        for kind in short {
            self.maps.insert((kind, family));
        }
        self.services.insert((family, service));
    }

    fn names(&self) -> BTreeSet<&NamespacedName> {
        self.services.iter().map(|(_, s)| s).collect()
    }

    /// Services refused in at least one family.
    pub fn distinct_services(&self) -> usize {
        self.names().len()
    }

    /// The first few refused services, sorted.
    pub fn examples(&self) -> Vec<String> {
        self.names()
            .into_iter()
            .take(EXAMPLES)
            .map(ToString::to_string)
            .collect()
    }

    pub fn full_maps(&self, budget: &Budget) -> Vec<FullMap> {
        self.maps
            .iter()
            .map(|(kind, family)| budget.full_map(*kind, *family))
            .collect()
    }
}

/// The candidates in admission order: those with entries in the maps first, then by family
/// and name. (family, service) is unique among them, so an unstable sort orders them the
/// same as a stable one. The order is found on keys taken out once (a sort comparing the
/// candidates themselves followed four pointers per side and comparison, into records
/// scattered over a cold start's memory: a third of a second for a hundred thousand), and
/// each candidate is moved once after (a candidate is a few hundred bytes).
pub(super) fn in_admission_order(candidates: Vec<Candidate>) -> Vec<Candidate> {
    let mut keys: Vec<AdmissionKey<'_>> = candidates
        .iter()
        .enumerate()
        .map(|(position, c)| AdmissionKey {
            new_to_the_maps: c.old.svc.is_empty(),
            family: c.family,
            namespace: c.service.namespace(),
            name: c.service.name(),
            position,
        })
        .collect();
    if keys.is_sorted_by(|a, b| a.cmp(b).is_le()) {
        return candidates;
    }
    keys.sort_unstable_by(AdmissionKey::cmp);
    let order: Vec<usize> = keys.into_iter().map(|k| k.position).collect();
    let mut slots: Vec<Option<Candidate>> = candidates.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|position| slots[position].take())
        .collect()
}

/// What orders a candidate for admission, borrowed from it, and where it is.
struct AdmissionKey<'a> {
    /// Nothing of the service is in the maps yet (services that are there go first).
    new_to_the_maps: bool,
    family: IpFamily,
    namespace: &'a str,
    name: &'a str,
    position: usize,
}

impl AdmissionKey<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.new_to_the_maps, self.family)
            .cmp(&(other.new_to_the_maps, other.family))
            // Namespaces are interned: most pairs share one text, told without reading it.
            .then_with(|| {
                if std::ptr::eq(self.namespace, other.namespace) {
                    std::cmp::Ordering::Equal
                } else {
                    self.namespace.cmp(other.namespace)
                }
            })
            .then_with(|| self.name.cmp(other.name))
    }
}

/// The map an exhausted id allocator stands for (its ids are the map's keys).
fn exhausted_map(e: &Exhausted) -> MapKind {
    if e.kind == "rev_nat" {
        MapKind::RevNat
    } else {
        MapKind::Backends
    }
}

fn family_of(addr: &std::net::IpAddr) -> IpFamily {
    if addr.is_ipv6() {
        IpFamily::V6
    } else {
        IpFamily::V4
    }
}

impl ApplyState {
    /// The services this sync must look at (every one on a full sync, which reads what the
    /// maps hold into `actual`; otherwise the changed ones and those refused before), with
    /// what each has in the maps, in no particular order (see [`in_admission_order`]).
    pub(super) fn candidates(
        &mut self,
        families: &[FamilyState],
        node: &NodeContext,
        changed: &std::collections::HashSet<NamespacedName>,
        actual: Option<&Snapshot>,
    ) -> Vec<Candidate> {
        let full = actual.is_some();
        let mut out = Vec::new();
        // The maps' service entries by frontend, sorted once for all the services to
        // adopt (a filter over every entry per service made a restart quadratic).
        let mut by_frontend: Option<Vec<(SvcEntryKey, SvcValue)>> = None;
        for state in families {
            let family = state.family;
            // The services asked for (each once), and those the state knows of that must
            // be looked at too: every one it holds on a full sync, the refused ones always.
            let (mut services, others): (Vec<NamespacedName>, Vec<NamespacedName>) = if full {
                let held = self.services.keys().chain(self.deferred.iter());
                (
                    state.services.services().cloned().collect(),
                    held.filter(|(f, _)| *f == family)
                        .map(|(_, s)| s.clone())
                        .collect(),
                )
            } else {
                let refused = self.deferred.iter().filter(|(f, _)| *f == family);
                // A changed service this family neither has nor had is nothing to it: a
                // cold start of 100,000 IPv4 services on a dual-stack node made as many
                // empty IPv6 candidates, each sorted, worked out and admitted for nothing.
                let concerned = |s: &&NamespacedName| {
                    state.services.has_ports(s)
                        || self.services.contains_key(&(family, (*s).clone()))
                };
                (
                    changed.iter().filter(concerned).cloned().collect(),
                    refused.map(|(_, s)| s.clone()).collect(),
                )
            };
            // In name order (each once): the candidates then come out in admission order
            // when all are new to the maps, as in a cold sync, and `in_admission_order`
            // (see `ApplyState::prepare_read`) finds them so. Sorting the names moves
            // pointers; putting 100,000 candidates in order afterwards moved each one's
            // whole desired state, twice.
            services.extend(others);
            services.sort_unstable();
            services.dedup();
            // What each service should have depends on the model alone: a cold sync of
            // thousands works it out on every core.
            let workers = parallel::workers_for(services.len(), PARALLEL_DESIRED_MIN);
            let desired =
                parallel::map_each(&mut services, workers, |s| desired_service(s, state, node));
            for (service, desired) in services.into_iter().zip(desired) {
                let old = match self.take_service(&(family, service.clone())) {
                    Some(old) => old,
                    None => actual
                        .map(|a| {
                            let by_frontend = by_frontend.get_or_insert_with(|| {
                                let mut all: Vec<(SvcEntryKey, SvcValue)> =
                                    a.svc.iter().map(|(k, v)| (*k, *v)).collect();
                                all.sort_unstable_by_key(|(k, _)| *k);
                                all
                            });
                            self.adopt_service(family, &service, &desired, a, by_frontend)
                        })
                        .unwrap_or_default(),
                };
                out.push(Candidate {
                    family,
                    service,
                    desired,
                    old,
                });
            }
        }
        out
    }

    /// Plans `candidate` if its entries fit in the room left, or keeps what it had.
    pub(super) fn admit(
        &mut self,
        candidate: Candidate,
        actual: Option<&Snapshot>,
        budget: &mut Budget,
        plan: &mut Plan,
        refusals: &mut Refusals,
    ) {
        let Candidate {
            family,
            service,
            desired,
            old,
        } = candidate;
        let mut trial = Plan::default();
        let mut new = AppliedService::default();
        let verdict = match self.build(family, &service, &desired, &mut new, &mut trial) {
            Ok(()) => budget.take(family, &self.demand(family, &new, &old, &trial, actual)),
            Err(exhausted) => Err(vec![exhausted_map(&exhausted)]),
        };
        match verdict {
            Ok(()) => {
                for (addr, entry) in &trial.backend_entries {
                    self.backend_ids
                        .set_payload(addr, Some(BackendFlags::of(entry)));
                }
                plan.absorb(trial);
                // A full sync (`actual`) plans its writes from what the maps hold.
                plan.diff_service(&old, &new, actual.is_none());
                self.release(family, &service, &old, plan);
                if !new.svc.is_empty() {
                    new.shrink_to_fit();
                    self.put_service((family, service), new);
                }
            }
            Err(short) => {
                debug!(%service, ?family, maps = ?short, "service does not fit in the maps");
                // Nothing of `new` is written: its references go (ids it was the first to
                // take are free again at once), `old` stays as it was.
                self.release(family, &service, &new, &mut Plan::default());
                self.maglev.forget(&trial);
                for id in &trial.fresh_backends {
                    self.backend_ids.forget(u64::from(*id));
                }
                for id in &trial.fresh_rev_nat {
                    self.rev_nat_ids.forget(u64::from(*id));
                }
                if !old.svc.is_empty() {
                    self.put_service((family, service.clone()), old);
                }
                refusals.add(family, service, short);
            }
        }
    }

    /// The entries `new` adds to the maps: those not in them already (`actual` on a full
    /// sync; otherwise what the service had, and ids handed out for the first time).
    fn demand(
        &self,
        family: IpFamily,
        new: &AppliedService,
        old: &AppliedService,
        trial: &Plan,
        actual: Option<&Snapshot>,
    ) -> Demand {
        let Some(actual) = actual else {
            return Demand {
                svc_entries: new.svc.keys().filter(|k| !old.svc.contains_key(k)).count(),
                src_ranges: new.src_ranges.difference(&old.src_ranges).count(),
                backends: trial.fresh_backends.clone(),
                rev_nat: trial.fresh_rev_nat.clone(),
            };
        };
        let is_v6 = family == IpFamily::V6;
        Demand {
            svc_entries: new
                .svc
                .keys()
                .filter(|k| !actual.svc.contains_key(k))
                .count(),
            src_ranges: new
                .src_ranges
                .iter()
                .filter(|r| !actual.src_ranges.contains(r))
                .count(),
            backends: new
                .backends
                .iter()
                .filter_map(|addr| self.backend_ids.get(addr))
                .map(|id| id as u32)
                .filter(|id| !actual.backends.contains_key(&(is_v6, *id)))
                .collect(),
            rev_nat: new
                .frontends
                .iter()
                .filter_map(|key| self.rev_nat_ids.get(key))
                .map(|id| id as u32)
                .filter(|id| !actual.rev_nat.contains_key(&(is_v6, *id)))
                .collect(),
        }
    }

    /// The entries the maps hold by the agent's account (what the last sync left).
    pub(in crate::proxier::ebpf) fn entries(&self) -> PerMap {
        let mut out = PerMap::default();
        for ((family, _), applied) in &self.services {
            out.add(MapKind::Services, *family, applied.svc.len());
            out.add(MapKind::SourceRanges, *family, applied.src_ranges.len());
        }
        for (addr, _, written) in self.backend_ids.iter() {
            if written.is_some() {
                out.add(MapKind::Backends, family_of(&addr.addr), 1);
            }
        }
        for key in self.owners.keys() {
            if self.rev_nat_ids.get(key).is_some() {
                out.add(MapKind::RevNat, family_of(&key.addr), 1);
            }
        }
        out
    }

    /// What a previous agent programmed for `service`, read back from the maps with one
    /// reference on each id it uses: the entries of its desired frontends whose rev_nat
    /// ids were adopted, and of its ClusterIP wildcards. A frontend whose entries do not
    /// match the adopted ids is left out (a full sync rewrites it).
    fn adopt_service(
        &mut self,
        family: IpFamily,
        service: &NamespacedName,
        desired: &DesiredService,
        actual: &Snapshot,
        by_frontend: &[(SvcEntryKey, SvcValue)],
    ) -> AppliedService {
        let owner = (family, service.clone());
        let mut out = AppliedService::default();
        for frontend in &desired.frontends {
            let key = frontend.key;
            if self.owners.get(&key).is_some_and(|o| *o != owner) {
                continue;
            }
            let slot0 = SvcEntryKey {
                frontend: key,
                scope: SCOPE_EXTERNAL,
                slot: 0,
            };
            let Some(rev_nat_id) = actual.svc.get(&slot0).map(|v| v.rev_nat_id) else {
                continue;
            };
            if self.rev_nat_ids.get(&key) != Some(u64::from(rev_nat_id)) {
                continue;
            }
            let first = by_frontend.partition_point(|(k, _)| k.frontend < key);
            let entries: Vec<(SvcEntryKey, SvcValue)> = by_frontend[first..]
                .iter()
                .take_while(|(k, _)| k.frontend == key)
                .copied()
                .collect();
            let Some(backends) = self.adopted_backends(&entries, actual, v6(&key.addr)) else {
                continue;
            };
            if self.rev_nat_ids.acquire(&key).is_err() {
                continue;
            }
            self.owners.insert(key, owner.clone());
            out.frontends.push(key);
            for addr in backends {
                if self.backend_ids.acquire(&addr).is_ok() {
                    out.backends.push(addr);
                }
            }
            for scope in [SCOPE_EXTERNAL, SCOPE_INTERNAL] {
                let affinity = entries
                    .iter()
                    .any(|(k, v)| k.scope == scope && k.slot == 0 && v.backend_id != 0);
                if affinity {
                    let ids = entries
                        .iter()
                        .filter(|(k, _)| k.scope == scope && k.slot > 0)
                        .map(|(_, v)| v.backend_id)
                        .collect();
                    out.affinity.push((rev_nat_id, ids));
                }
            }
            out.svc.extend(entries);
            out.src_ranges.extend(
                actual
                    .src_ranges
                    .iter()
                    .filter(|(id, _)| *id == rev_nat_id)
                    .copied(),
            );
        }
        for ip in &desired.wildcards {
            let key = SvcEntryKey::wildcard(*ip);
            if let Some(value) = actual.svc.get(&key) {
                out.svc.insert(key, *value);
            }
        }
        out.shrink_to_fit();
        out
    }

    /// The backend addresses of a frontend's slots, if every slot points at a backend whose
    /// id was adopted for that address.
    fn adopted_backends(
        &self,
        entries: &[(SvcEntryKey, SvcValue)],
        actual: &Snapshot,
        is_v6: bool,
    ) -> Option<Vec<BackendAddr>> {
        entries
            .iter()
            .filter(|(k, _)| k.slot > 0)
            .map(|(_, v)| {
                let entry = actual.backends.get(&(is_v6, v.backend_id))?;
                (self.backend_ids.get(&entry.addr) == Some(u64::from(v.backend_id)))
                    .then_some(entry.addr)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use proxy_common::SvcValue;

    use super::*;

    fn candidate(family: IpFamily, name: &str, programmed: bool) -> Candidate {
        in_namespace(family, "ns", name, programmed)
    }

    fn in_namespace(family: IpFamily, namespace: &str, name: &str, programmed: bool) -> Candidate {
        let mut old = AppliedService::default();
        if programmed {
            old.svc.insert(
                SvcEntryKey::wildcard("10.96.0.1".parse().unwrap()),
                SvcValue::default(),
            );
        }
        Candidate {
            family,
            service: NamespacedName::new(namespace, name),
            desired: DesiredService::default(),
            old,
        }
    }

    fn names(candidates: &[Candidate]) -> Vec<String> {
        candidates.iter().map(Candidate::label).collect()
    }

    #[test]
    fn names_order_candidates_by_namespace_then_name_as_the_model_orders_them() {
        let shuffled = vec![
            in_namespace(IpFamily::V4, "shop", "a", false),
            in_namespace(IpFamily::V4, "bank", "z", false),
            in_namespace(IpFamily::V4, "shop-2", "a", false),
            in_namespace(IpFamily::V4, "bank", "a", false),
            in_namespace(IpFamily::V4, "", "m", false),
            in_namespace(IpFamily::V4, "shop", "b", false),
        ];
        let mut expected: Vec<NamespacedName> =
            shuffled.iter().map(|c| c.service.clone()).collect();
        expected.sort();
        let ordered: Vec<NamespacedName> = in_admission_order(shuffled)
            .into_iter()
            .map(|c| c.service)
            .collect();
        assert_eq!(ordered, expected);
        assert_eq!(
            ordered.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["/m", "bank/a", "bank/z", "shop/a", "shop/b", "shop-2/a"]
        );
    }

    #[test]
    fn candidates_go_programmed_first_then_by_family_and_name() {
        let shuffled = vec![
            candidate(IpFamily::V6, "b", false),
            candidate(IpFamily::V4, "d", false),
            candidate(IpFamily::V4, "c", true),
            candidate(IpFamily::V6, "a", true),
            candidate(IpFamily::V4, "a", false),
            candidate(IpFamily::V4, "e", true),
        ];
        let ordered = in_admission_order(shuffled);
        assert_eq!(
            names(&ordered),
            [
                "V4/ns/c", "V4/ns/e", "V6/ns/a", "V4/ns/a", "V4/ns/d", "V6/ns/b"
            ]
        );
        // What is in order already comes back as it is.
        assert_eq!(
            names(&in_admission_order(ordered)),
            [
                "V4/ns/c", "V4/ns/e", "V6/ns/a", "V4/ns/a", "V4/ns/d", "V6/ns/b"
            ]
        );
    }
}
