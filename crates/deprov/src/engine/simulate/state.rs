//! One simulated run of PostgreSQL's after-trigger queue ([`Run`]) over the rows read so far
//! ([`Store`]).

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};

use super::CascadeFailure;
use super::load::{Facts, Kind};
use super::store::{Key, Store, Val};
use crate::engine::Plan;

/// A queued after-trigger event.
#[derive(Debug, Clone)]
pub(super) enum Event {
    /// A delete action of foreign key `fk` for the deleted referenced row `row`.
    Action { fk: usize, kind: Kind, row: usize },
    /// The check of foreign key `fk` on referencing row `row` updated to version `version`.
    Check { fk: usize, row: usize, version: u32 },
    /// A deferred NO ACTION check of `fk` for a deleted key (fired at commit).
    NoActionAtCommit { fk: usize, key: Key },
}

/// One simulated run of the cascade: what it deleted and updated, and its trigger queues.
pub(super) struct Run {
    /// Multi-row statements meet rows in descending physical order instead of ascending.
    reverse: bool,
    /// Per row of the store: 0 while the run has not deleted it, else 1 + the generation whose
    /// firing deleted it (the root rows: generation 0). Rows past the end: not deleted.
    deleted: Vec<u32>,
    /// The generation of events firing now (see `Ctx::run_keeping`); 0 before the first.
    generation: u32,
    over: HashMap<usize, Vec<Option<Val>>>,
    version: HashMap<usize, u32>,
    /// Per probe: the rows updated to each key.
    over_index: HashMap<usize, HashMap<Key, Vec<usize>>>,
    /// The query's event list, fired first in first out: events queued while firing are appended and
    /// fired in later passes (`AfterTriggerEndQuery` in `src/backend/commands/trigger.c`).
    pub queue: VecDeque<Event>,
    /// Events deferred to commit, in queue order.
    pub at_commit: Vec<Event>,
    /// Whether a statement met more than one row (then their order may matter).
    pub multi: bool,
    /// Whether the outcome may depend on the order a statement meets its rows in ([`Self::contest`]):
    /// the run updated a row, or a check found a referencing row that its own generation deleted.
    pub contested: bool,
}

impl Run {
    pub fn new(reverse: bool) -> Self {
        Self {
            reverse,
            deleted: Vec::new(),
            generation: 0,
            over: HashMap::new(),
            version: HashMap::new(),
            over_index: HashMap::new(),
            queue: VecDeque::new(),
            at_commit: Vec::new(),
            multi: false,
            contested: false,
        }
    }

    /// Starts firing the next generation of events.
    pub fn next_generation(&mut self) {
        self.generation += 1;
    }

    /// Rows the run updated and did not delete, with their values at the end.
    pub fn survivors(&self) -> impl Iterator<Item = (usize, &Vec<Option<Val>>)> {
        self.over
            .iter()
            .filter(|&(&r, _)| !self.is_deleted(r))
            .map(|(&r, v)| (r, v))
    }

    fn is_deleted(&self, row: usize) -> bool {
        self.deleted.get(row).is_some_and(|&g| g > 0)
    }

    /// Marks the run [`Self::contested`] when a row under `key` of `probe` was deleted by the
    /// generation firing now. Called by the checks that can fail (RESTRICT, NO ACTION, SET NULL,
    /// SET DEFAULT) when they fire.
    ///
    /// Why that suffices: while the run updates no row, the rows deleted by the end of each
    /// generation are the same in any row order — a row goes with the first generation that fires
    /// a CASCADE action of a parent of it, and a generation's events are those of the rows the one
    /// before it deleted, whatever their order. A check fires in the generation after its row's
    /// delete, so a referencing row deleted by an earlier generation is gone in every order, one
    /// never deleted is there in every order; only one deleted by the check's own generation may
    /// be gone in one order and not in another. So when the run succeeded and is not contested, it
    /// succeeds in every order.
    fn contest(&mut self, store: &Store, probe: usize, key: &[Val]) {
        let now = self.generation + 1;
        if store
            .indexed(probe, key)
            .iter()
            .any(|&r| self.deleted.get(r) == Some(&now))
        {
            self.contested = true;
        }
    }

    fn vals<'a>(&'a self, store: &'a Store, row: usize) -> &'a [Option<Val>] {
        self.over.get(&row).unwrap_or(&store.rows[row].vals)
    }

    /// The live rows whose `probe` columns now equal `key`, in the run's scan order.
    fn matches(&self, store: &Store, probe: usize, key: &[Val]) -> Vec<usize> {
        let extra = self
            .over_index
            .get(&probe)
            .and_then(|by| by.get(key))
            .map_or(&[][..], Vec::as_slice);
        let mut out: Vec<usize> = store
            .indexed(probe, key)
            .iter()
            .chain(extra)
            .copied()
            .filter(|&r| !self.is_deleted(r))
            .filter(|&r| store.key_is(probe, self.vals(store, r), key))
            .collect();
        out.sort_unstable_by_key(|&r| (store.rows[r].rel, store.rows[r].tid));
        out.dedup();
        if self.reverse {
            out.reverse();
        }
        out
    }

    /// The `(probe, key)` lookups `events` will make that were not read yet.
    pub fn needs(&self, store: &Store, events: &[Event]) -> Vec<(usize, Key)> {
        let mut out = Vec::new();
        for ev in events {
            let (probe, key) = match ev {
                Event::Action { fk, row, .. } => {
                    let key = store.key(store.referenced_probe(*fk), self.vals(store, *row));
                    (store.referencing_probe(*fk), key)
                }
                Event::Check { fk, row, .. } => {
                    let key = store.key(store.referencing_probe(*fk), self.vals(store, *row));
                    (store.referenced_probe(*fk), key)
                }
                Event::NoActionAtCommit { fk, key } => {
                    (store.referencing_probe(*fk), Some(key.clone()))
                }
            };
            if let Some(key) = key
                && !store.is_loaded(probe, &key)
            {
                out.push((probe, key));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Deletes `rows` (one statement) and queues their delete triggers, row by row in name order.
    pub fn delete(&mut self, store: &Store, facts: &Facts, rows: &[usize]) {
        for &r in rows {
            if self.deleted.len() <= r {
                self.deleted.resize(store.rows.len().max(r + 1), 0);
            }
            self.deleted[r] = self.generation + 1;
        }
        for &r in rows {
            for t in facts.triggers.get(&store.rows[r].rel).into_iter().flatten() {
                if t.kind == Kind::Check {
                    continue;
                }
                if t.deferred {
                    // Only NO ACTION triggers can be deferred: the key is checked at commit.
                    let key = store.key(store.referenced_probe(t.fk), self.vals(store, r));
                    if let Some(key) = key {
                        self.at_commit
                            .push(Event::NoActionAtCommit { fk: t.fk, key });
                    }
                } else {
                    self.queue.push_back(Event::Action {
                        fk: t.fk,
                        kind: t.kind,
                        row: r,
                    });
                }
            }
        }
    }

    /// Sets `row`'s columns and queues the checks of the foreign keys whose (non-NULL) values
    /// changed — or of every key with non-NULL values when the row was already updated in this run:
    /// its old version was then written by the cascade's own transaction, and PostgreSQL checks
    /// whether or not the keys changed (`RI_FKey_fk_upd_check_required`, PostgreSQL 15
    /// `ri_triggers.c`).
    fn update(&mut self, store: &Store, facts: &Facts, row: usize, new: Vec<Option<Val>>) {
        // An updated row may leave or enter a key, and be checked: order may matter.
        self.contested = true;
        let old = self.vals(store, row).to_vec();
        let table = store.rows[row].table;
        for &p in store.probes_of(table) {
            if let Some(k) = store.key(p, &new) {
                self.over_index
                    .entry(p)
                    .or_default()
                    .entry(k)
                    .or_default()
                    .push(row);
            }
        }
        let written_here = self.version.contains_key(&row);
        let version = {
            let v = self.version.entry(row).or_insert(0);
            *v += 1;
            *v
        };
        self.over.insert(row, new.clone());
        for t in facts
            .triggers
            .get(&store.rows[row].rel)
            .into_iter()
            .flatten()
        {
            if t.kind != Kind::Check {
                continue;
            }
            let p = store.referencing_probe(t.fk);
            let (before, after) = (store.key(p, &old), store.key(p, &new));
            if after.is_none() || (after == before && !written_here) {
                continue;
            }
            let ev = Event::Check {
                fk: t.fk,
                row,
                version,
            };
            if t.deferred {
                self.at_commit.push(ev);
            } else {
                self.queue.push_back(ev);
            }
        }
    }

    /// Fires one event as PostgreSQL's referential trigger would (`ri_triggers.c`); `Err` is the
    /// error the cascade would raise.
    pub fn fire(
        &mut self,
        store: &Store,
        facts: &Facts,
        plan: &Plan,
        ev: Event,
    ) -> Result<(), Box<CascadeFailure>> {
        let fks = &plan.catalog.foreign_keys;
        match ev {
            Event::Check { fk, row, version } => {
                if self.is_deleted(row) || self.version.get(&row) != Some(&version) {
                    return Ok(()); // that row version is gone: nothing to check
                }
                let key = store.key(store.referencing_probe(fk), self.vals(store, row));
                let Some(key) = key else { return Ok(()) };
                if self
                    .matches(store, store.referenced_probe(fk), &key)
                    .is_empty()
                {
                    return Err(Box::new(CascadeFailure::missing_parent(
                        plan,
                        fk,
                        &store.texts(&key),
                    )));
                }
                Ok(())
            }
            Event::NoActionAtCommit { fk, key } => {
                self.contest(store, store.referencing_probe(fk), &key);
                let refs = self.matches(store, store.referencing_probe(fk), &key);
                if refs.is_empty() {
                    Ok(())
                } else {
                    Err(Box::new(CascadeFailure::referenced(
                        plan,
                        fk,
                        refs.len(),
                        true,
                    )))
                }
            }
            Event::Action { fk, kind, row } => {
                let f = &fks[fk];
                let Some(key) = store.key(store.referenced_probe(fk), self.vals(store, row)) else {
                    return Ok(());
                };
                let probe = store.referencing_probe(fk);
                if kind != Kind::Cascade {
                    self.contest(store, probe, &key);
                }
                let refs = self.matches(store, probe, &key);
                self.multi |= refs.len() > 1;
                match kind {
                    _ if refs.is_empty() => Ok(()),
                    Kind::Cascade => {
                        self.delete(store, facts, &refs);
                        Ok(())
                    }
                    Kind::Restrict => Err(Box::new(CascadeFailure::referenced(
                        plan,
                        fk,
                        refs.len(),
                        false,
                    ))),
                    // Deferred NO ACTION triggers went to `at_commit` when queued; there the key is
                    // checked again after every cascade.
                    Kind::NoAction => Err(Box::new(CascadeFailure::referenced(
                        plan,
                        fk,
                        refs.len(),
                        false,
                    ))),
                    Kind::SetNull | Kind::SetDefault => {
                        let tracked = &store.tracked[&f.from];
                        for &r in &refs {
                            let mut new = self.vals(store, r).to_vec();
                            for (n, c) in facts.set_cols[fk].iter().enumerate() {
                                let value = store.set_val(fk, n);
                                if c.not_null && value.is_none() {
                                    return Err(Box::new(CascadeFailure::not_null(
                                        plan, fk, &c.column,
                                    )));
                                }
                                if let Some(i) = tracked.iter().position(|x| *x == c.column) {
                                    new[i] = value;
                                }
                            }
                            self.update(store, facts, r, new);
                        }
                        // SET DEFAULT re-checks like NO ACTION: a row set to the deleted key fails.
                        if kind == Kind::SetDefault && !self.matches(store, probe, &key).is_empty()
                        {
                            return Err(Box::new(CascadeFailure::referenced(plan, fk, 1, false)));
                        }
                        Ok(())
                    }
                    Kind::Check => Ok(()),
                }
            }
        }
    }
}
