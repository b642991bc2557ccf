//! The rows read so far ([`Store`]), indexed by every foreign key's columns on both ends.
//!
//! Values are compared by their text form (`::text`), the way rows are read: equal keys whose text
//! differs (`numeric` 1.0 and 1, `citext`, a `float8` -0) are not recognized as equal. Each distinct
//! text is held once and named by a [`Val`], so keys are compared and hashed as small integers.

use foldhash::{HashMap, HashMapExt, HashSet};

use super::load::{Facts, Loaded};
use crate::engine::Plan;

/// A value's text, interned by [`Store`]: two values are equal exactly when their texts are.
pub(super) type Val = u32;

/// A probe's key: its columns' values, none NULL.
pub(super) type Key = Vec<Val>;

/// Rows of `table` looked up by the values of `cols` (at `pos` among the table's tracked columns).
pub(super) struct Probe {
    pub table: u32,
    pub cols: Vec<String>,
    pub(super) pos: Vec<usize>,
}

/// One row read from the database, with its values as read.
pub(super) struct Row {
    pub table: u32,
    /// `tableoid`: the table or its leaf partition, whose triggers fire.
    pub rel: u32,
    /// `ctid` as (block, offset): the physical order a sequential scan meets rows in.
    pub tid: (u32, u32),
    pub vals: Vec<Option<Val>>,
}

/// Every row read, indexed by each probe's key. The database is never written, so a key once read is
/// complete for the whole simulation (both runs).
pub(super) struct Store {
    /// Per table: the columns read (referencing and referenced columns of its foreign keys).
    pub tracked: HashMap<u32, Vec<String>>,
    pub probes: Vec<Probe>,
    /// Per table, per columns: the probe.
    probe_of: HashMap<u32, HashMap<Vec<String>, usize>>,
    /// Per foreign key (its index in the catalog): the probes of its referencing and referenced
    /// columns, looked up once here instead of by column names at every event.
    fk_probes: Vec<(usize, usize)>,
    table_probes: HashMap<u32, Vec<usize>>,
    pub rows: Vec<Row>,
    by_id: HashMap<(u32, (u32, u32)), usize>,
    /// Per probe: the rows held under each key.
    index: Vec<HashMap<Key, Vec<usize>>>,
    /// Per probe: the keys read whole.
    loaded: Vec<HashSet<Key>>,
    /// Per single-column probe: its keys read, in the order read.
    loaded_keys: HashMap<usize, Vec<String>>,
    /// Per table: how many of its rows are held.
    held: HashMap<u32, usize>,
    /// Per table: its probes with keys whose rows are never held ([`Self::leave_unread`]).
    unread: HashMap<u32, Vec<(usize, Key)>>,
    /// Every text seen, by its [`Val`], and the reverse.
    texts: Vec<String>,
    ids: HashMap<String, Val>,
    /// Per foreign key (by index): the values its SET NULL / SET DEFAULT action writes, in the order
    /// of [`Facts::set_cols`].
    set_vals: Vec<Vec<Option<Val>>>,
}

fn parse_tid(text: &str) -> (u32, u32) {
    let inner = text.trim_matches(|c| c == '(' || c == ')');
    let mut it = inner.split(',').map(|p| p.trim().parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

impl Store {
    /// Probes for both ends of every foreign key, and the root's key; the values `facts`' SET NULL /
    /// SET DEFAULT actions write.
    pub fn new(plan: &Plan, facts: &Facts) -> Self {
        let mut tracked: HashMap<u32, Vec<String>> = HashMap::new();
        let mut wanted: Vec<(u32, Vec<String>)> = vec![(plan.root, vec![plan.key_column.clone()])];
        for fk in &plan.catalog.foreign_keys {
            wanted.push((fk.from, fk.from_cols.clone()));
            wanted.push((fk.to, fk.to_cols.clone()));
        }
        for (table, cols) in &wanted {
            let t = tracked.entry(*table).or_default();
            for c in cols {
                if !t.contains(c) {
                    t.push(c.clone());
                }
            }
        }
        let mut store = Self {
            tracked,
            probes: Vec::new(),
            probe_of: HashMap::new(),
            fk_probes: Vec::new(),
            table_probes: HashMap::new(),
            rows: Vec::new(),
            by_id: HashMap::new(),
            index: Vec::new(),
            loaded: Vec::new(),
            loaded_keys: HashMap::new(),
            held: HashMap::new(),
            unread: HashMap::new(),
            texts: Vec::new(),
            ids: HashMap::new(),
            set_vals: Vec::new(),
        };
        store.set_vals = facts
            .set_cols
            .iter()
            .map(|cols| {
                cols.iter()
                    .map(|c| c.value.as_deref().map(|v| store.intern(v)))
                    .collect()
            })
            .collect();
        for (table, cols) in wanted {
            if store
                .probe_of
                .get(&table)
                .is_some_and(|by| by.contains_key(&cols))
            {
                continue;
            }
            let t = &store.tracked[&table];
            let pos = cols
                .iter()
                .map(|c| t.iter().position(|x| x == c).expect("tracked"))
                .collect();
            store
                .probe_of
                .entry(table)
                .or_default()
                .insert(cols.clone(), store.probes.len());
            store
                .table_probes
                .entry(table)
                .or_default()
                .push(store.probes.len());
            store.probes.push(Probe { table, cols, pos });
            store.index.push(HashMap::new());
            store.loaded.push(HashSet::default());
        }
        store.fk_probes = plan
            .catalog
            .foreign_keys
            .iter()
            .map(|fk| {
                (
                    store.probe(fk.from, &fk.from_cols),
                    store.probe(fk.to, &fk.to_cols),
                )
            })
            .collect();
        store
    }

    /// The [`Val`] of `text`, interning it when new. `u32::MAX` texts would take over 100 GB here
    /// (each `String` is 24 bytes before its text), so every store that fits in memory numbers its
    /// texts apart.
    pub fn intern(&mut self, text: &str) -> Val {
        if let Some(&v) = self.ids.get(text) {
            return v;
        }
        let v = Val::try_from(self.texts.len()).unwrap_or(Val::MAX);
        self.texts.push(text.to_owned());
        self.ids.insert(text.to_owned(), v);
        v
    }

    /// The text of `v`.
    pub fn text(&self, v: Val) -> &str {
        self.texts.get(v as usize).map_or("", String::as_str)
    }

    /// The texts of `key`.
    pub fn texts(&self, key: &[Val]) -> Vec<String> {
        key.iter().map(|&v| self.text(v).to_owned()).collect()
    }

    /// The value foreign key `fk`'s SET NULL / SET DEFAULT action writes into its `i`-th column of
    /// [`Facts::set_cols`] (`None` = NULL).
    pub fn set_val(&self, fk: usize, i: usize) -> Option<Val> {
        self.set_vals
            .get(fk)
            .and_then(|c| c.get(i).copied().flatten())
    }

    /// The probe of foreign key `fk`'s referencing columns (`fk` indexes the catalog's keys).
    pub fn referencing_probe(&self, fk: usize) -> usize {
        self.fk_probes[fk].0
    }

    /// The probe of foreign key `fk`'s referenced columns.
    pub fn referenced_probe(&self, fk: usize) -> usize {
        self.fk_probes[fk].1
    }

    /// The probes of `table`'s columns.
    pub fn probes_of(&self, table: u32) -> &[usize] {
        self.table_probes.get(&table).map_or(&[], Vec::as_slice)
    }

    /// The probe of `cols` of `table` (every foreign key's ends exist).
    pub fn probe(&self, table: u32, cols: &[String]) -> usize {
        self.probe_of[&table][cols]
    }

    /// The probe's key in `vals` (values of the probe's table); `None` when a value is NULL (MATCH
    /// SIMPLE: such a row references nothing, and nothing references it).
    pub fn key(&self, probe: usize, vals: &[Option<Val>]) -> Option<Key> {
        self.probes[probe].pos.iter().map(|&i| vals[i]).collect()
    }

    /// Whether the probe's key in `vals` is `key` (no NULL in it): [`Self::key`] without building
    /// the key.
    pub fn key_is(&self, probe: usize, vals: &[Option<Val>], key: &[Val]) -> bool {
        let pos = &self.probes[probe].pos;
        pos.len() == key.len() && pos.iter().zip(key).all(|(&i, &k)| vals[i] == Some(k))
    }

    pub fn is_loaded(&self, probe: usize, key: &[Val]) -> bool {
        self.loaded[probe].contains(key)
    }

    /// Records rows read for `keys` of `probe`; rows already known keep their first copy.
    pub fn add(&mut self, probe: usize, keys: Vec<Key>, rows: Vec<Loaded>) {
        let table = self.probes[probe].table;
        for (rel, tid, vals) in rows {
            let id = (rel as u32, parse_tid(&tid));
            if self.by_id.contains_key(&id) {
                continue;
            }
            let vals: Vec<Option<Val>> = vals
                .iter()
                .map(|v| v.as_deref().map(|t| self.intern(t)))
                .collect();
            if self.is_unread(table, &vals) {
                continue;
            }
            let n = self.rows.len();
            self.by_id.insert(id, n);
            for &p in &self.table_probes[&table] {
                if let Some(k) = self.key(p, &vals) {
                    self.index[p].entry(k).or_default().push(n);
                }
            }
            self.rows.push(Row {
                table,
                rel: id.0,
                tid: id.1,
                vals,
            });
            *self.held.entry(table).or_default() += 1;
        }
        let single = self.probes[probe].cols.len() == 1;
        for key in keys {
            if single && !self.loaded[probe].contains(&key) {
                let texts = self.texts(&key);
                self.loaded_keys.entry(probe).or_default().extend(texts);
            }
            self.loaded[probe].insert(key);
        }
    }

    /// Records `key` of the single-column `probe` as read, its rows left out of the store for good:
    /// rows the cascade deletes before anything it simulates can see them
    /// ([`super::scope::unread`]). A read of the table leaves them out ([`Self::known`]), and a row
    /// holding `key` that a read returns anyway is dropped.
    pub fn leave_unread(&mut self, probe: usize, key: Key) {
        let table = self.probes[probe].table;
        self.unread
            .entry(table)
            .or_default()
            .push((probe, key.clone()));
        self.add(probe, vec![key], Vec::new());
    }

    /// Whether a row of `table` with `vals` holds a key left unread ([`Self::leave_unread`]).
    fn is_unread(&self, table: u32, vals: &[Option<Val>]) -> bool {
        self.unread
            .get(&table)
            .is_some_and(|keys| keys.iter().any(|(p, k)| self.key_is(*p, vals, k)))
    }

    /// What is known complete of `table` besides probe `except`: per single-column probe with keys
    /// read, its column and those keys. Every row of `table` whose column holds one of them is held
    /// already (rows are read per key, whole) or left unread for good ([`Self::leave_unread`]), so
    /// a read of `table` may leave such rows out and find them through [`Self::indexed`] instead.
    /// Empty while no row of `table` is held and none is left unread.
    pub fn known(&self, table: u32, except: usize) -> Vec<(&str, &[String])> {
        if self.held.get(&table).is_none_or(|&n| n == 0) && !self.unread.contains_key(&table) {
            return Vec::new();
        }
        self.table_probes[&table]
            .iter()
            .filter(|&&p| p != except)
            .filter_map(|p| {
                let keys = self.loaded_keys.get(p)?;
                Some((self.probes[*p].cols[0].as_str(), keys.as_slice()))
            })
            .collect()
    }

    pub(super) fn indexed(&self, probe: usize, key: &[Val]) -> &[usize] {
        self.index[probe].get(key).map_or(&[], Vec::as_slice)
    }
}
