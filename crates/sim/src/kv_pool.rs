//! A paged KV pool that behaves like GPU memory: freed pages keep their contents.
//!
//! The pool holds `kv_tokens` token slots in pages of `page_size`. Each page stores token ids
//! (standing in for their KV vectors) and a fill count. Freed pages go back on the free list
//! **without being cleared**, most recently freed first and in the order they were freed, so
//! the next request lands on the previous request's pages. That is what lets the incident's
//! bug show: a request that writes less than it allocated reads someone else's tokens.
//!
//! The pool never waits: taking pages either succeeds now or not at all. Who gets pages when
//! they are short (the waiting queue, its order and its bounded wait) is the scheduler's
//! business (`scheduler.rs`); the pool only wakes it whenever pages come back.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

/// Why a request got no pages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PoolError {
    /// The request needs more tokens than the whole pool holds; waiting cannot help.
    #[error("the request needs {need} KV tokens but the pool holds only {capacity}")]
    TooLarge { need: usize, capacity: usize },
    /// The request waited in the queue for the whole bounded wait without being admitted.
    #[error("no room for {need} KV tokens within {waited:?}: the KV pool is exhausted")]
    Exhausted { need: usize, waited: Duration },
}

struct Page {
    slots: Vec<u32>,
    fill: usize,
}

struct PoolState {
    pages: Vec<Page>,
    free: VecDeque<usize>,
}

/// The shared pool; allocations borrow pages from it and give them back on drop.
pub(crate) struct KvPool {
    state: Mutex<PoolState>,
    /// Woken after every free, so a scheduler waiting for pages re-checks.
    freed: Arc<Notify>,
    page_size: usize,
    capacity: usize,
}

/// Pages owned by one request; dropping it frees them (also when a client disconnects).
pub(crate) struct Allocation {
    pool: Arc<KvPool>,
    pages: Vec<usize>,
}

impl KvPool {
    /// A pool of `capacity` tokens in pages of `page_size`; `freed` is woken after each free.
    pub(crate) fn new(capacity: usize, page_size: usize, freed: Arc<Notify>) -> Arc<Self> {
        let page_size = page_size.max(1);
        let num_pages = capacity.div_ceil(page_size);
        let pages = (0..num_pages)
            .map(|_| Page {
                slots: vec![0; page_size],
                fill: 0,
            })
            .collect();
        Arc::new(Self {
            state: Mutex::new(PoolState {
                pages,
                free: (0..num_pages).collect(),
            }),
            freed,
            page_size,
            capacity,
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state stays consistent between statements, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tokens held by allocated pages.
    pub(crate) fn used_tokens(&self) -> usize {
        let state = self.lock();
        (state.pages.len() - state.free.len()) * self.page_size
    }

    /// The pool's size in tokens (`max_total_num_tokens`).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Pages that hold `tokens` tokens (at least one: even an empty prompt gets a page).
    pub(crate) fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size).max(1)
    }

    /// Takes `max_pages` pages, or as many as are free if that is at least `min_pages`; `None`
    /// (and nothing taken) when fewer than `min_pages` are free. Never waits.
    pub(crate) fn try_allocate(
        self: &Arc<Self>,
        min_pages: usize,
        max_pages: usize,
    ) -> Option<Allocation> {
        let mut state = self.lock();
        if state.free.len() < min_pages {
            return None;
        }
        let take = max_pages.min(state.free.len());
        let pages: Vec<usize> = state.free.drain(..take).collect();
        Some(Allocation {
            pool: Arc::clone(self),
            pages,
        })
    }

    fn free(&self, pages: &[usize]) {
        {
            let mut state = self.lock();
            // Most recently freed first, in the order they were freed: the next allocation
            // gets these very pages back, starting with this request's first page.
            for &page in pages.iter().rev() {
                state.free.push_front(page);
            }
        }
        self.freed.notify_waiters();
    }
}

impl Allocation {
    /// Number of token slots of the allocation.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.pages.len() * self.pool.page_size
    }

    /// Writes `tokens` from the first slot on, as a prefill of this request does. Pages past
    /// the written tokens are reserved for generation and count as empty.
    pub(crate) fn write(&self, tokens: &[u32]) {
        let size = self.pool.page_size;
        let mut state = self.pool.lock();
        for (i, &page) in self.pages.iter().enumerate() {
            let start = (i * size).min(tokens.len());
            let end = ((i + 1) * size).min(tokens.len());
            let Some(p) = state.pages.get_mut(page) else {
                continue;
            };
            if let Some(dst) = p.slots.get_mut(..end - start) {
                dst.copy_from_slice(tokens.get(start..end).unwrap_or_default());
            }
            p.fill = end - start;
        }
    }

    /// Appends `tokens` after the first `offset` slots (generated tokens after the prompt).
    pub(crate) fn write_at(&self, offset: usize, tokens: &[u32]) {
        let size = self.pool.page_size;
        let mut state = self.pool.lock();
        for (k, &token) in tokens.iter().enumerate() {
            let pos = offset + k;
            let Some(&page) = self.pages.get(pos / size) else {
                break;
            };
            let Some(p) = state.pages.get_mut(page) else {
                break;
            };
            if let Some(slot) = p.slots.get_mut(pos % size) {
                *slot = token;
            }
            p.fill = p.fill.max(pos % size + 1);
        }
    }

    /// Writes one token into slot 0 of the first page and nothing else: the incident's
    /// placeholder. Every other slot and page keeps whatever an earlier request left there.
    pub(crate) fn write_placeholder(&self, token: u32) {
        let mut state = self.pool.lock();
        let Some(p) = self
            .pages
            .first()
            .and_then(|&page| state.pages.get_mut(page))
        else {
            return;
        };
        if let Some(slot) = p.slots.first_mut() {
            *slot = token;
        }
        p.fill = p.fill.max(1);
    }

    /// The request's KV content: each page's slots `[0, fill)`, in page order.
    pub(crate) fn content(&self) -> Vec<u32> {
        let state = self.pool.lock();
        let mut out = Vec::new();
        for &page in &self.pages {
            if let Some(p) = state.pages.get(page) {
                out.extend_from_slice(p.slots.get(..p.fill).unwrap_or_default());
            }
        }
        out
    }

    #[cfg(test)]
    fn page_ids(&self) -> &[usize] {
        &self.pages
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.pool.free(&self.pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(capacity: usize) -> Arc<KvPool> {
        KvPool::new(capacity, 4, Arc::new(Notify::new()))
    }

    fn take(pool: &Arc<KvPool>, tokens: usize) -> Allocation {
        let pages = pool.pages_for(tokens);
        pool.try_allocate(pages, pages).unwrap()
    }

    #[test]
    fn freed_pages_are_reused_most_recent_first_in_free_order() {
        let pool = pool(32);
        let a = take(&pool, 8);
        let b = take(&pool, 8);
        assert_eq!(a.page_ids(), &[0, 1]);
        assert_eq!(b.page_ids(), &[2, 3]);
        drop(a);
        drop(b);
        // b was freed last, so its pages come first, in their order, then a's.
        let c = take(&pool, 16);
        assert_eq!(c.page_ids(), &[2, 3, 0, 1]);
        assert_eq!(pool.used_tokens(), 16);
    }

    #[test]
    fn freeing_does_not_clear_contents() {
        let pool = pool(16);
        let a = take(&pool, 6);
        a.write(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(a.content(), vec![1, 2, 3, 4, 5, 6]);
        drop(a);
        let b = take(&pool, 16);
        // Nothing written yet: b sees a's stale tokens.
        assert_eq!(b.content(), vec![1, 2, 3, 4, 5, 6]);
        b.write_placeholder(99);
        assert_eq!(b.content(), vec![99, 2, 3, 4, 5, 6]);
        // A proper write replaces the content and empties the pages past it.
        b.write(&[7]);
        assert_eq!(b.content(), vec![7]);
        b.write_at(1, &[8, 9, 10, 11]);
        assert_eq!(b.content(), vec![7, 8, 9, 10, 11]);
    }

    #[test]
    fn a_ranged_take_gets_what_is_free_and_a_short_pool_gives_nothing() {
        let pool = pool(16);
        let held = take(&pool, 8);
        let capped = pool.try_allocate(1, 250).unwrap();
        assert_eq!(capped.capacity(), 8);
        assert!(pool.try_allocate(1, 1).is_none());
        drop(capped);
        assert!(pool.try_allocate(3, 3).is_none());
        assert_eq!(pool.used_tokens(), 8);
        drop(held);
        assert_eq!(pool.used_tokens(), 0);
    }

    #[tokio::test]
    async fn a_free_wakes_whoever_waits_for_pages() {
        let freed = Arc::new(Notify::new());
        let pool = KvPool::new(8, 4, Arc::clone(&freed));
        let held = take(&pool, 8);
        let notified = freed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        drop(held);
        notified.await;
    }
}
