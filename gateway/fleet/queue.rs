//! A pool's gateway queue (issue 30): while the pool is full, requests wait here, bounded,
//! instead of piling into the engines' backlog or being refused at once.
//!
//! Order: a higher [`Priority`] class always goes first (a critical request never waits
//! behind a sheddable one). Inside a class, tenants share by **weighted fair queuing** on
//! served KV tokens: each class keeps a virtual clock; an entry of tenant `t` starts at
//! `max(clock, t's last finish)` and finishes at `start + cost / weight`; the smallest finish
//! goes first, FIFO on ties; releasing an entry moves the clock to its start. So backlogged
//! equal-weight tenants alternate, weight 2 gets twice the tokens of weight 1, and a light
//! tenant arriving behind a noisy tenant's long backlog is served next, not behind it.
//!
//! [`FairQueue::release`] hands turns out head first and stops at a head that does not fit
//! (nothing overtakes inside the queue, so a large request is not starved by small ones).
//! A full queue sheds the newest entry of its lowest class below the newcomer's, or refuses
//! the newcomer. Tickets time out at their deadline; a dropped ticket leaves the queue.
//!
//! Pure data and timers: no request stage, no pool. Memory is bounded by `max_queued`:
//! one record per queued entry, and per class one per tenant with entries queued or served
//! in the class's current busy period (a class that empties forgets its tenants).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::Priority;

mod drain;
mod types;

use drain::Drain;
pub use types::{Head, QueueEntry, QueueRefusal, QueueSnapshot};

/// Virtual time is fixed point with this many fraction bits, in `u128`: `cost / weight`
/// keeps its precision, and no sum of `u64` costs can overflow it in practice (additions
/// saturate regardless).
const FRACTION_BITS: u32 = 16;
/// `retry_after` when nothing was released within the window (the rate is unknown).
const UNKNOWN_RATE_RETRY: Duration = Duration::from_secs(5);
/// `retry_after` bounds.
const MIN_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

type VTime = u128;
type Outcome = Result<(), QueueRefusal>;

/// A pool's bounded, class-ordered, weighted-fair queue; share it as `Arc<FairQueue>`.
pub struct FairQueue {
    max_queued: usize,
    state: Arc<Mutex<State>>,
}

/// A place in the queue; await [`Ticket::turn`]. Dropping it leaves the queue.
pub struct Ticket {
    state: Arc<Mutex<State>>,
    id: u64,
    rx: oneshot::Receiver<Outcome>,
    deadline: Instant,
    joined: Instant,
    /// The outcome once known, and when.
    done: Option<(Outcome, Instant)>,
}

/// Order inside a class: smallest virtual finish, then arrival (ids only grow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    finish: VTime,
    id: u64,
}

struct Waiting {
    tenant: Arc<str>,
    start: VTime,
    /// The tenant's virtual finish after this entry (its charge).
    charged: VTime,
    cost: u64,
    under_share: bool,
    joined: Instant,
    wake: oneshot::Sender<Outcome>,
}

/// A tenant inside one class: its last virtual finish and how many entries it has queued.
#[derive(Debug, Default)]
struct Flow {
    finish: VTime,
    queued: usize,
}

/// One class: its entries in release order, its virtual clock, its tenants.
#[derive(Default)]
struct Lane {
    queue: BTreeMap<Key, Waiting>,
    clock: VTime,
    flows: HashMap<Arc<str>, Flow>,
}

struct State {
    /// Indexed by [`Priority::index`], lowest class first.
    lanes: [Lane; 3],
    /// Where each waiting entry sits: its lane and key.
    places: HashMap<u64, (usize, Key)>,
    next_id: u64,
    drain: Drain,
    /// Why it refuses everything, once closed.
    closed: Option<QueueRefusal>,
}

// === impl FairQueue ===

impl FairQueue {
    /// An empty queue holding at most `max_queued` entries (at least 1).
    pub fn new(max_queued: usize) -> Self {
        let state = State {
            lanes: Default::default(),
            places: HashMap::new(),
            next_id: 0,
            drain: Drain::new(Instant::now()),
            closed: None,
        };
        Self {
            max_queued: max_queued.max(1),
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// Join: `Err(Full)` at once when the queue is full and no queued entry has a strictly
    /// lower class than `entry.class`; otherwise the newest entry of the lowest class is
    /// shed (its ticket answers `Err(Shed)`) to make room. `Err(Closed)` once closed.
    pub fn join(&self, entry: QueueEntry) -> Result<Ticket, QueueRefusal> {
        let mut state = lock(&self.state);
        if let Some(reason) = state.closed {
            return Err(reason);
        }
        if state.places.len() >= self.max_queued {
            let Some(victim) = state.victim_for(&entry) else {
                return Err(QueueRefusal::Full);
            };
            if let Some(waiting) = state.remove(victim, false) {
                // The receiver may be gone already (its ticket is being dropped).
                let _ = waiting.wake.send(Err(QueueRefusal::Shed));
            }
        }
        let (tx, rx) = oneshot::channel();
        let id = state.next_id;
        state.next_id += 1;
        let index = entry.class.index();
        let lane = &mut state.lanes[index];
        let flow = lane.flows.entry(entry.tenant.clone()).or_default();
        let start = lane.clock.max(flow.finish);
        let span = (VTime::from(entry.cost) << FRACTION_BITS) / VTime::from(entry.weight.max(1));
        let charged = start.saturating_add(span);
        // A sparse tenant — nothing queued, and not ahead of its share (its finish is not
        // past the clock) — goes ahead of the backlogged tenants' heads, as fair queuing's
        // new-flow rule does: a light tenant is served at the next free room instead of
        // after one turn of every backlogged tenant. It is charged as usual, so it cannot
        // take more than its share this way.
        let sparse = entry.under_share || (flow.queued == 0 && flow.finish <= lane.clock);
        let key = Key {
            finish: if sparse { lane.clock } else { charged },
            id,
        };
        flow.finish = charged;
        flow.queued += 1;
        let now = Instant::now();
        lane.queue.insert(
            key,
            Waiting {
                tenant: entry.tenant,
                start,
                charged,
                cost: entry.cost,
                under_share: entry.under_share,
                joined: now,
                wake: tx,
            },
        );
        state.places.insert(id, (index, key));
        let len = state.places.len();
        state.drain.holding(len, now);
        Ok(Ticket {
            state: self.state.clone(),
            id,
            rx,
            deadline: entry.deadline,
            joined: now,
            done: None,
        })
    }

    /// Hand turns out: while the queue is not empty, take the head (highest class first;
    /// inside a class the smallest virtual finish; FIFO on ties) and ask `fits(head.cost)`;
    /// if true, remove it, wake its ticket (`Ok`) and go on; if false, stop: the head waits
    /// and nothing overtakes it. Returns how many were admitted.
    ///
    /// `fits` runs under the queue's lock: it must not call into this queue.
    pub fn release(&self, mut fits: impl FnMut(u64) -> bool) -> usize {
        self.release_with(|head| fits(head.cost))
    }

    /// [`FairQueue::release`], asking `fits` about the whole [`Head`].
    pub fn release_with(&self, mut fits: impl FnMut(&Head) -> bool) -> usize {
        let mut state = lock(&self.state);
        let mut admitted = 0;
        while let Some((_, key, head)) = state.head() {
            if !fits(&head) || !state.serve(key.id) {
                break;
            }
            admitted += 1;
        }
        admitted
    }

    /// Hand turns out past the head, in order, only to entries that `may_pass` names and
    /// `fits` says may go: room kept for them (`fleet::share`), which takes nothing the
    /// heads before them could use. Returns how many were admitted.
    ///
    /// `may_pass` and `fits` run under the queue's lock: they must not call into this queue.
    pub fn release_own(
        &self,
        may_pass: impl Fn(&Head) -> bool,
        mut fits: impl FnMut(&Head) -> bool,
    ) -> usize {
        let mut state = lock(&self.state);
        let candidates: Vec<(u64, Head)> = state
            .lanes
            .iter()
            .rev()
            .flat_map(|lane| lane.queue.iter())
            .map(|(key, w)| {
                let head = Head {
                    tenant: w.tenant.clone(),
                    cost: w.cost,
                    under_share: w.under_share,
                };
                (key.id, head)
            })
            .filter(|(_, head)| may_pass(head))
            .collect();
        let mut admitted = 0;
        for (id, head) in candidates {
            if fits(&head) && state.serve(id) {
                admitted += 1;
            }
        }
        admitted
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries waiting.
    pub fn len(&self) -> usize {
        lock(&self.state).places.len()
    }

    /// The bound it was built with.
    pub fn max_queued(&self) -> usize {
        self.max_queued
    }

    /// Depth by class and by tenant, the oldest wait and the recent drain rate.
    pub fn snapshot(&self) -> QueueSnapshot {
        let state = lock(&self.state);
        let now = Instant::now();
        let mut by_tenant: HashMap<Arc<str>, usize> = HashMap::new();
        let mut oldest = now;
        for lane in &state.lanes {
            for (tenant, flow) in lane.flows.iter().filter(|(_, f)| f.queued > 0) {
                *by_tenant.entry(tenant.clone()).or_default() += flow.queued;
            }
            for waiting in lane.queue.values() {
                oldest = oldest.min(waiting.joined);
            }
        }
        let mut by_tenant: Vec<_> = by_tenant.into_iter().collect();
        by_tenant.sort();
        QueueSnapshot {
            len: state.places.len(),
            max_queued: self.max_queued,
            by_class: Priority::ALL.map(|p| (p, state.lanes[p.index()].queue.len())),
            by_tenant,
            oldest_wait: now.saturating_duration_since(oldest),
            drain_rate: state.drain.rate(now),
        }
    }

    /// When a refused client may try again: the queue's length over its drain rate in the
    /// last 10 s, between 1 s and 60 s; 5 s when nothing drained in that window (the rate
    /// is unknown, and the queue does not know its callers' timeouts).
    pub fn retry_after(&self) -> Duration {
        let state = lock(&self.state);
        let rate = state.drain.rate(Instant::now());
        if rate <= 0.0 {
            return UNKNOWN_RATE_RETRY;
        }
        let secs = state.places.len() as f64 / rate;
        Duration::from_secs_f64(secs.clamp(MIN_RETRY.as_secs_f64(), MAX_RETRY.as_secs_f64()))
    }

    /// Refuse every waiting entry and every later join with `Closed` (also on drop).
    pub fn close(&self) {
        self.close_with(QueueRefusal::Closed);
    }

    /// Refuse every waiting entry and every later join with `reason`: `Draining` when the
    /// process shuts down (a queued request would only be cut by the drain).
    pub fn close_with(&self, reason: QueueRefusal) {
        let mut state = lock(&self.state);
        if state.closed.is_some() {
            return;
        }
        state.closed = Some(reason);
        let ids: Vec<u64> = state.places.keys().copied().collect();
        for id in ids {
            if let Some(waiting) = state.remove(id, false) {
                let _ = waiting.wake.send(Err(reason));
            }
        }
    }
}

impl Drop for FairQueue {
    fn drop(&mut self) {
        self.close();
    }
}

impl fmt::Debug for FairQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairQueue")
            .field("max_queued", &self.max_queued)
            .field("len", &self.len())
            .finish()
    }
}

// === impl Ticket ===

impl Ticket {
    /// Wait for the turn: `Ok` when released; `Err(TimedOut)` at the entry's deadline (the
    /// entry is then removed); `Err(Shed)` if a higher class pushed it out; `Err(Closed)`
    /// if the queue closed. Cancel-safe; once answered, it answers the same again.
    pub async fn turn(&mut self) -> Result<(), QueueRefusal> {
        if let Some((outcome, _)) = self.done {
            return outcome;
        }
        let outcome = tokio::select! {
            biased;
            sent = &mut self.rx => sent.unwrap_or(Err(QueueRefusal::Closed)),
            () = tokio::time::sleep_until(self.deadline) => self.expire(),
        };
        self.done = Some((outcome, Instant::now()));
        outcome
    }

    /// How long it waited: until its outcome, or until now while it waits.
    pub fn waited(&self) -> Duration {
        let end = self.done.map_or_else(Instant::now, |(_, at)| at);
        end.saturating_duration_since(self.joined)
    }

    /// The deadline passed: leave the queue, unless an outcome was sent just before.
    fn expire(&mut self) -> Outcome {
        if lock(&self.state).remove(self.id, false).is_some() {
            return Err(QueueRefusal::TimedOut);
        }
        self.rx.try_recv().unwrap_or(Err(QueueRefusal::Closed))
    }
}

impl Drop for Ticket {
    /// The client went away: an entry still queued leaves (no leak, no phantom head).
    fn drop(&mut self) {
        if self.done.is_none() {
            lock(&self.state).remove(self.id, false);
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .field("deadline", &self.deadline)
            .field("outcome", &self.done.map(|(o, _)| o))
            .finish()
    }
}

// === impl State ===

impl State {
    /// The entry to release next: its lane, key and cost.
    fn head(&self) -> Option<(usize, Key, Head)> {
        self.lanes.iter().enumerate().rev().find_map(|(l, lane)| {
            lane.queue.first_key_value().map(|(key, waiting)| {
                let head = Head {
                    tenant: waiting.tenant.clone(),
                    cost: waiting.cost,
                    under_share: waiting.under_share,
                };
                (l, *key, head)
            })
        })
    }

    /// Give entry `id` its turn: out of the queue, its lane's clock moved to its start, its
    /// ticket woken. False when it is gone already.
    fn serve(&mut self, id: u64) -> bool {
        let Some(&(index, _)) = self.places.get(&id) else {
            return false;
        };
        let Some(waiting) = self.remove(id, true) else {
            return false;
        };
        let lane = &mut self.lanes[index];
        lane.clock = lane.clock.max(waiting.start);
        let clock = lane.clock;
        // Forget tenants with nothing queued whose finish the clock has passed: they
        // would start at the clock anyway.
        lane.flows.retain(|_, f| f.queued > 0 || f.finish > clock);
        lane.settle();
        // Sent under the lock: a ticket that finds its entry gone finds its outcome.
        let _ = waiting.wake.send(Ok(()));
        self.drain.record(Instant::now());
        true
    }

    /// Take entry `id` out of the queue, keeping its tenant's flow consistent: a `served`
    /// entry stays charged to its tenant, an unserved one (shed, timed out, dropped) that
    /// was its tenant's newest is not.
    fn remove(&mut self, id: u64, served: bool) -> Option<Waiting> {
        let (index, key) = self.places.remove(&id)?;
        let lane = &mut self.lanes[index];
        let waiting = lane.queue.remove(&key)?;
        if self.places.is_empty() {
            self.drain.holding(0, Instant::now());
        }
        let clock = lane.clock;
        if let Some(flow) = lane.flows.get_mut(&waiting.tenant) {
            flow.queued = flow.queued.saturating_sub(1);
            if !served && flow.finish == waiting.charged {
                flow.finish = waiting.start;
            }
            if flow.queued == 0 && flow.finish <= clock {
                lane.flows.remove(&waiting.tenant);
            }
        }
        lane.settle();
        Some(waiting)
    }
}

// === impl Lane ===

impl Lane {
    /// At the end of a busy period (nothing queued), move the clock past every finish and
    /// forget every tenant, as start-time fair queuing does: every tenant starts equal in
    /// the next busy period, and memory stays bounded.
    fn settle(&mut self) {
        if self.queue.is_empty() {
            let latest = self.flows.values().map(|f| f.finish).max().unwrap_or(0);
            self.clock = self.clock.max(latest);
            self.flows.clear();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

mod shed;

#[cfg(test)]
mod tests;
