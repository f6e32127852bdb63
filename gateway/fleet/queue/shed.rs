//! Which entry a full queue sheds for a newcomer.

use super::{QueueEntry, State};

impl State {
    /// What a full queue sheds for `entry`, if anything: the newest entry of the lowest
    /// class below its class; else, in its own class, the newest entry of the tenant with
    /// the most entries queued, when that tenant has at least two more than `entry`'s
    /// (fair queuing drops from the longest flow: a flood fills the queue, and a light
    /// tenant's request takes the flood's place instead of being refused).
    pub(super) fn victim_for(&self, entry: &QueueEntry) -> Option<u64> {
        let class = entry.class.index();
        if let Some(lane) = (0..class).find(|&l| !self.lanes[l].queue.is_empty()) {
            return self.lanes[lane].queue.keys().map(|k| k.id).max();
        }
        let lane = &self.lanes[class];
        let own = lane.flows.get(&entry.tenant).map_or(0, |f| f.queued);
        let (heaviest, flow) = lane
            .flows
            .iter()
            .filter(|(tenant, _)| **tenant != entry.tenant)
            .max_by_key(|(_, f)| f.queued)?;
        if flow.queued < own + 2 {
            return None;
        }
        lane.queue
            .iter()
            .filter(|(_, w)| w.tenant == *heaviest)
            .map(|(k, _)| k.id)
            .max()
    }
}
