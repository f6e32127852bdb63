//! Admission into the running batch: a FIFO waiting queue in front of the KV pool.
//!
//! Policy (SGLang's default, `--schedule-policy fcfs`): requests are admitted strictly in
//! arrival order, and only the head of the waiting queue may be admitted, when its pages fit
//! the free pool and the running batch is under `max_running_requests` (if set). A request
//! that does not fit blocks the ones behind it, as SGLang's prefill adder stops at the first
//! request it cannot add, so a large request is never starved by small ones passing it.
//!
//! What a request reserves: its prompt plus its whole `max_new_tokens` (already clipped to
//! `max_req_len` by the caller), taken at admission and held until its response ends. SGLang
//! admits against the prompt plus `min(max_new_tokens, 4096) * new_token_ratio`, allocates
//! while decoding and retracts requests when decode runs out of pages; reserving everything
//! up front is the conservative end of that (a ratio of 1), needs no retraction, and keeps
//! the pages a request writes its answer into (the incident's faults depend on them).
//!
//! Nothing waits forever: a request not admitted within the bounded wait (the engine's
//! `bootstrap_timeout`, 5 s by default) leaves the queue with [`PoolError::Exhausted`]; one
//! whose future is dropped (its client went away) leaves it at once. Either way the request
//! behind it becomes the head and is looked at again.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::kv_pool::{Allocation, KvPool, PoolError};
use super::stats::{bump, SimStats};

/// What one request asks of the scheduler.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Demand<'a> {
    /// The request's id, recorded in admission order.
    pub(crate) rid: &'a str,
    /// KV tokens to reserve: the prompt plus its (clipped) `max_new_tokens`.
    pub(crate) kv_tokens: usize,
    /// The prompt's length: what a waiting request adds to `/get_load`'s `num_tokens`.
    pub(crate) prompt_tokens: usize,
}

/// The engine's load right now, as its load endpoints report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Load {
    /// Requests in the running batch.
    pub(crate) running: usize,
    /// Requests in the waiting queue.
    pub(crate) waiting: usize,
    /// Prompt tokens of the waiting requests.
    pub(crate) waiting_prompt_tokens: usize,
    /// KV tokens held by allocated pages (running requests and published prefill rooms).
    pub(crate) used_tokens: usize,
}

struct Waiter {
    ticket: u64,
    prompt_tokens: usize,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    waiting: VecDeque<Waiter>,
    running: usize,
}

/// The running batch and its waiting queue.
pub(crate) struct Scheduler {
    pool: Arc<KvPool>,
    queue: Mutex<Queue>,
    /// Woken when pages are freed (the pool holds it too), a seat is released or the head of
    /// the queue changes: every waiter re-checks whether it is now the admissible head.
    wake: Arc<Notify>,
    /// The engine's change signal, so tests can wait on queue counters without sleeping.
    changed: Arc<Notify>,
    stats: Arc<SimStats>,
    max_running: Option<NonZeroUsize>,
    wait: Duration,
}

/// A request in the running batch: its pages, and its seat in the batch.
///
/// Dropping it frees the pages and then the seat (field order), which wakes the queue.
pub(crate) struct Running {
    pages: Allocation,
    _seat: Seat,
}

/// One place in the running batch; released on drop.
struct Seat {
    scheduler: Arc<Scheduler>,
}

/// A place in the waiting queue; leaving it un-admitted (timeout, dropped future) removes it.
struct Ticket<'a> {
    scheduler: &'a Scheduler,
    id: u64,
    admitted: bool,
}

// === impl Scheduler ===

impl Scheduler {
    /// A scheduler over `pool`, whose frees must wake `wake` (see [`KvPool::new`]).
    pub(crate) fn new(
        pool: Arc<KvPool>,
        wake: Arc<Notify>,
        changed: Arc<Notify>,
        stats: Arc<SimStats>,
        max_running: Option<NonZeroUsize>,
        wait: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            pool,
            queue: Mutex::new(Queue::default()),
            wake,
            changed,
            stats,
            max_running,
            wait,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every update is a few statements under the lock; a poisoned queue is still whole.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool behind the batch.
    pub(crate) fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }

    /// Running and waiting requests and the pool's use, read together.
    pub(crate) fn load(&self) -> Load {
        let queue = self.lock();
        Load {
            running: queue.running,
            waiting: queue.waiting.len(),
            waiting_prompt_tokens: queue.waiting.iter().map(|w| w.prompt_tokens).sum(),
            used_tokens: self.pool.used_tokens(),
        }
    }

    /// Admits `demand` with all the pages it reserves, waiting in line (bounded) for them.
    /// A demand larger than the whole pool is refused at once: waiting cannot help it.
    pub(crate) async fn admit(self: &Arc<Self>, demand: Demand<'_>) -> Result<Running, PoolError> {
        let capacity = self.pool.capacity();
        if demand.kv_tokens > capacity {
            return Err(PoolError::TooLarge {
                need: demand.kv_tokens,
                capacity,
            });
        }
        let pages = self.pool.pages_for(demand.kv_tokens);
        self.wait_turn(demand, pages, pages).await
    }

    /// Admits `demand` with the pages that are free when its turn comes (at least one, at
    /// most what it asks): what the incident's engine did for a prompt it had not checked
    /// against its pool.
    pub(crate) async fn admit_capped(
        self: &Arc<Self>,
        demand: Demand<'_>,
    ) -> Result<Running, PoolError> {
        let pages = self.pool.pages_for(demand.kv_tokens);
        self.wait_turn(demand, 1, pages).await
    }

    async fn wait_turn(
        self: &Arc<Self>,
        demand: Demand<'_>,
        min_pages: usize,
        max_pages: usize,
    ) -> Result<Running, PoolError> {
        let mut ticket = self.enqueue(demand.prompt_tokens);
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut first_try = true;
        loop {
            // Register for a wake-up before checking, so a change in between is not missed.
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(pages) = self.try_admit(&mut ticket, demand.rid, min_pages, max_pages) {
                return Ok(Running {
                    pages,
                    _seat: Seat {
                        scheduler: Arc::clone(self),
                    },
                });
            }
            if first_try {
                first_try = false;
                bump(&self.stats.queued);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                // `ticket` drops here and takes the request out of the queue.
                return Err(PoolError::Exhausted {
                    need: demand.kv_tokens,
                    waited: self.wait,
                });
            }
        }
    }

    fn enqueue(&self, prompt_tokens: usize) -> Ticket<'_> {
        let mut queue = self.lock();
        let id = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push_back(Waiter {
            ticket: id,
            prompt_tokens,
        });
        let waiting = queue.waiting.len();
        drop(queue);
        bump(&self.stats.scheduled);
        self.stats.raise_peak_waiting(waiting);
        self.changed.notify_waiters();
        Ticket {
            scheduler: self,
            id,
            admitted: false,
        }
    }

    /// Admits the ticket's request if it heads the queue and its pages and a seat are free.
    fn try_admit(
        &self,
        ticket: &mut Ticket<'_>,
        rid: &str,
        min_pages: usize,
        max_pages: usize,
    ) -> Option<Allocation> {
        let mut queue = self.lock();
        if queue.waiting.front().map(|w| w.ticket) != Some(ticket.id) {
            return None;
        }
        if self
            .max_running
            .is_some_and(|max| queue.running >= max.get())
        {
            return None;
        }
        let pages = self.pool.try_allocate(min_pages, max_pages)?;
        queue.waiting.pop_front();
        queue.running += 1;
        ticket.admitted = true;
        let running = queue.running;
        // Read under the queue lock: no other admission can interleave, so the peak is exact.
        let used = self.pool.used_tokens();
        drop(queue);
        self.stats.record_admission(rid, running, used);
        // The next in line may fit as well.
        self.wake.notify_waiters();
        self.changed.notify_waiters();
        Some(pages)
    }
}

// === impl Running ===

impl Running {
    /// Leaves the running batch but keeps the pages (a prefill hands them to its room).
    pub(crate) fn leave_batch(self) -> Allocation {
        self.pages
    }
}

impl Deref for Running {
    type Target = Allocation;

    fn deref(&self) -> &Allocation {
        &self.pages
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let scheduler = &self.scheduler;
        {
            let mut queue = scheduler.lock();
            queue.running = queue.running.saturating_sub(1);
        }
        scheduler.wake.notify_waiters();
        scheduler.changed.notify_waiters();
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.admitted {
            return;
        }
        let scheduler = self.scheduler;
        scheduler.lock().waiting.retain(|w| w.ticket != self.id);
        // If it was the head, the next request is the head now.
        scheduler.wake.notify_waiters();
        scheduler.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
