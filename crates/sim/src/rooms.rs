//! Bootstrap rooms: where a prefill publishes a request's KV for its decode to collect.
//!
//! A room is keyed by the `bootstrap_room` both sides received. Either side may arrive
//! first: a waiting decode creates the room as pending and is woken through a `watch`
//! channel when the prefill publishes it. A ready room holds the prefill's pages until the
//! decode took the content (or a TTL passed), then frees them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::kv_pool::Allocation;

/// How long a published room (and the pages it holds) waits for its decode.
pub(crate) const ROOM_TTL: Duration = Duration::from_secs(30);

/// An abort as SGLang reports it in `finish_reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AbortInfo {
    pub(crate) message: String,
    /// `None` when the abort carries `"status_code": null`.
    pub(crate) status_code: Option<u16>,
    pub(crate) err_type: Option<String>,
}

/// What a room holds.
#[derive(Clone, Debug)]
pub(crate) enum RoomState {
    /// Not published yet.
    Pending,
    /// KV content, the prompt length the prefill reports for it, and how much of the
    /// prompt the prefill found in its prefix cache (the decode reports it, as SGLang's
    /// decode takes `cached_tokens` from the prefill's transferred metadata).
    Ready {
        tokens: Arc<Vec<u32>>,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// The prefill aborted the request.
    Aborted(AbortInfo),
}

struct Room {
    state: watch::Sender<RoomState>,
    /// Prefill pages backing a ready room, freed once the content was handed out.
    pages: Mutex<Option<Allocation>>,
}

/// All rooms of one prefill engine.
#[derive(Default)]
pub(crate) struct Rooms {
    map: Mutex<HashMap<u64, Arc<Room>>>,
}

impl Rooms {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Room>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn room(&self, id: u64) -> Arc<Room> {
        Arc::clone(self.lock().entry(id).or_insert_with(|| {
            Arc::new(Room {
                state: watch::Sender::new(RoomState::Pending),
                pages: Mutex::new(None),
            })
        }))
    }

    fn remove_if_same(&self, id: u64, room: &Arc<Room>) {
        let mut map = self.lock();
        if map.get(&id).is_some_and(|r| Arc::ptr_eq(r, room)) {
            map.remove(&id);
        }
    }

    /// Publishes a room; `pages` stay allocated until the decode fetched it or [`ROOM_TTL`].
    pub(crate) fn publish(
        self: &Arc<Self>,
        id: u64,
        state: RoomState,
        pages: Option<Allocation>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let room = self.room(id);
        *room.pages.lock().unwrap_or_else(|p| p.into_inner()) = pages;
        room.state.send_replace(state);
        let rooms = Arc::clone(self);
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(ROOM_TTL) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
            rooms.remove_if_same(id, &room);
            let pages = room.pages.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(pages);
        });
    }

    /// Waits up to `wait` for room `id` to be published; takes it when it is.
    ///
    /// A ready room is handed out once: its pages are freed before this returns, so the
    /// next prefill request can land on them.
    pub(crate) async fn take(&self, id: u64, wait: Duration) -> Option<RoomState> {
        let room = self.room(id);
        let mut rx = room.state.subscribe();
        let published =
            tokio::time::timeout(wait, rx.wait_for(|s| !matches!(s, RoomState::Pending)))
                .await
                .ok()
                .and_then(Result::ok)
                .map(|state| state.clone());
        drop(rx);
        match published {
            Some(state) => {
                self.remove_if_same(id, &room);
                let pages = room.pages.lock().unwrap_or_else(|p| p.into_inner()).take();
                drop(pages);
                Some(state)
            }
            None => {
                // Forget a room that only waiters created, unless another waiter is on it.
                if matches!(*room.state.borrow(), RoomState::Pending)
                    && room.state.receiver_count() == 0
                {
                    self.remove_if_same(id, &room);
                }
                None
            }
        }
    }
}
