//! A paged KV pool that behaves like GPU memory: freed pages keep their contents.
//!
//! The pool holds `kv_tokens` token slots in pages of `page_size`. Each page stores token ids
//! (standing in for their KV vectors) and a fill count. Freed pages go back on the free list
//! **without being cleared**, most recently freed first and in the order they were freed, so
//! the next request lands on the previous request's pages. That is what lets the incident's
//! bug show: a request that writes less than it allocated reads someone else's tokens.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

/// Why pages could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PoolError {
    /// The request needs more tokens than the whole pool holds; waiting cannot help.
    #[error("the request needs {need} KV tokens but the pool holds only {capacity}")]
    TooLarge { need: usize, capacity: usize },
    /// Not enough pages were freed within the bounded wait.
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
    freed: Notify,
    page_size: usize,
    capacity: usize,
    wait: Duration,
}

/// Pages owned by one request; dropping it frees them (also when a client disconnects).
pub(crate) struct Allocation {
    pool: Arc<KvPool>,
    pages: Vec<usize>,
}

impl KvPool {
    /// A pool of `capacity` tokens in pages of `page_size`; allocations wait at most `wait`.
    pub(crate) fn new(capacity: usize, page_size: usize, wait: Duration) -> Arc<Self> {
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
            freed: Notify::new(),
            page_size,
            capacity,
            wait,
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

    /// Allocates pages for `tokens` tokens, waiting (bounded) for other requests to free some.
    pub(crate) async fn allocate(self: &Arc<Self>, tokens: usize) -> Result<Allocation, PoolError> {
        if tokens > self.capacity {
            return Err(PoolError::TooLarge {
                need: tokens,
                capacity: self.capacity,
            });
        }
        let pages = tokens.div_ceil(self.page_size).max(1);
        self.allocate_pages(pages, pages, tokens).await
    }

    /// Allocates pages for up to `tokens` tokens, taking what is free now (at least one page,
    /// waiting for it if need be). This is what the incident's engine did for an over-long
    /// prompt: it allocated for the original length, capped at what the pool could give.
    pub(crate) async fn allocate_capped(
        self: &Arc<Self>,
        tokens: usize,
    ) -> Result<Allocation, PoolError> {
        let wanted = tokens.div_ceil(self.page_size).max(1);
        self.allocate_pages(1, wanted, tokens).await
    }

    async fn allocate_pages(
        self: &Arc<Self>,
        min_pages: usize,
        max_pages: usize,
        tokens: usize,
    ) -> Result<Allocation, PoolError> {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            // Register for a wake-up before checking, so a free between check and wait is seen.
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.lock();
                if state.free.len() >= min_pages {
                    let take = max_pages.min(state.free.len());
                    let pages: Vec<usize> = state.free.drain(..take).collect();
                    return Ok(Allocation {
                        pool: Arc::clone(self),
                        pages,
                    });
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(PoolError::Exhausted {
                    need: tokens,
                    waited: self.wait,
                });
            }
        }
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
        KvPool::new(capacity, 4, Duration::from_secs(1))
    }

    #[tokio::test]
    async fn freed_pages_are_reused_most_recent_first_in_free_order() {
        let pool = pool(32);
        let a = pool.allocate(8).await.unwrap();
        let b = pool.allocate(8).await.unwrap();
        assert_eq!(a.page_ids(), &[0, 1]);
        assert_eq!(b.page_ids(), &[2, 3]);
        drop(a);
        drop(b);
        // b was freed last, so its pages come first, in their order, then a's.
        let c = pool.allocate(16).await.unwrap();
        assert_eq!(c.page_ids(), &[2, 3, 0, 1]);
        assert_eq!(pool.used_tokens(), 16);
    }

    #[tokio::test]
    async fn freeing_does_not_clear_contents() {
        let pool = pool(16);
        let a = pool.allocate(6).await.unwrap();
        a.write(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(a.content(), vec![1, 2, 3, 4, 5, 6]);
        drop(a);
        let b = pool.allocate(16).await.unwrap();
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

    #[tokio::test]
    async fn capped_allocation_takes_what_is_free() {
        let pool = pool(16);
        let held = pool.allocate(8).await.unwrap();
        let capped = pool.allocate_capped(1000).await.unwrap();
        assert_eq!(capped.capacity(), 8);
        drop(held);
    }

    #[tokio::test]
    async fn too_large_fails_at_once() {
        let pool = pool(16);
        let err = pool.allocate(17).await.err().unwrap();
        assert_eq!(
            err,
            PoolError::TooLarge {
                need: 17,
                capacity: 16
            }
        );
    }

    #[tokio::test]
    async fn allocation_waits_for_freed_pages_but_only_for_a_bounded_time() {
        let pool = KvPool::new(8, 4, Duration::from_millis(50));
        let held = pool.allocate(8).await.unwrap();
        // Nothing frees: the wait ends with Exhausted after the bound.
        let err = pool.allocate(4).await.err().unwrap();
        assert!(matches!(err, PoolError::Exhausted { need: 4, .. }));
        // A free during the wait wakes the waiter (this pool waits long enough).
        let pool = KvPool::new(8, 4, Duration::from_secs(30));
        let held2 = pool.allocate(8).await.unwrap();
        let waiter = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.allocate(8).await.map(|a| a.page_ids().to_vec()) }
        });
        // Let the waiter register before freeing; the result does not depend on timing.
        tokio::task::yield_now().await;
        drop(held);
        drop(held2);
        assert_eq!(waiter.await.unwrap().unwrap(), vec![0, 1]);
    }
}
