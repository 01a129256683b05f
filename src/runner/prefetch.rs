//! The claim-ahead buffer (DESIGN Q3): actions claimed before a slot is free for them, held
//! in claim order and started first-in first-out as slots free, and the policy that sizes and
//! times claim rounds.
//!
//! Sizing: while the queue is *deep* (the last claim returned every action it asked for), a
//! round asks for every free slot plus the room left in the buffer, and the next round is
//! started once the buffer is down to half, so slots are fed from memory while the next round
//! trip is under way. While the queue is *shallow* (the last claim came back short, or the
//! runner is busy with nothing buffered) a round asks only for the free slots and starts as
//! soon as a wake-up arrives: a lone enqueue starts at once, and a runner with no free slot
//! leaves new work to runners that have one. A runner starts out deep (it assumes a backlog).
//!
//! The buffer's size follows what the slots consume, between the concurrency (or `prefetch`,
//! if smaller) and `prefetch`: it doubles after a round trip during which the buffer ran dry
//! while a slot was free (the slots outran the claims: bigger rounds, and on SQLite fewer
//! commits per action), and halves after one during which less than half of what was buffered
//! started (slow handlers: no point holding leases other runners could use). A runner with fast
//! handlers on a deep queue so claims up to `concurrency + prefetch` per round trip, one with
//! slow handlers about its concurrency.
//!
//! The buffer only holds order; whether a buffered action is still held (its lease, the
//! heartbeat's view of it) lives in the lease registry (`held`).

use crate::store::ClaimedAction;
use std::collections::VecDeque;

/// Claimed actions waiting for a slot, and the sizing state.
#[derive(Debug)]
pub(crate) struct Prefetch {
    /// The most actions ever buffered (`prefetch`).
    capacity: usize,
    /// The least the size adapts down to.
    floor: usize,
    /// The current size.
    target: usize,
    queue: VecDeque<ClaimedAction>,
    deep: bool,
    /// The claim round in flight: buffered when it started, started since, ran dry.
    at_round_start: usize,
    started: usize,
    starved: bool,
}

impl Prefetch {
    /// A buffer holding at most `capacity` actions beyond the running ones (0: claims are
    /// sized to free slots only), adapting down to `concurrency` (or `capacity`, if smaller).
    pub(crate) fn new(capacity: usize, concurrency: usize) -> Self {
        Self {
            capacity,
            floor: concurrency.min(capacity),
            target: capacity,
            queue: VecDeque::new(),
            deep: true,
            at_round_start: 0,
            started: 0,
            starved: false,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// The buffer's current size.
    #[cfg(test)]
    pub(crate) fn target(&self) -> usize {
        self.target
    }

    /// How many actions the next claim round should ask for, given `free` slots: 0 means no
    /// round is worth a round trip now.
    pub(crate) fn claim_limit(&self, free: usize) -> usize {
        if !self.deep {
            return if self.queue.is_empty() { free } else { 0 };
        }
        if self.queue.len() > self.target / 2 {
            return 0;
        }
        free + self.target.saturating_sub(self.queue.len())
    }

    /// A claim round starts: its measurements begin.
    pub(crate) fn round_started(&mut self) {
        self.at_round_start = self.queue.len();
        self.started = 0;
        self.starved = false;
    }

    /// A buffered action started.
    pub(crate) fn started_one(&mut self) {
        self.started += 1;
    }

    /// A slot was free with nothing buffered while a claim round was in flight.
    pub(crate) fn ran_dry(&mut self) {
        self.starved = true;
    }

    /// Appends a claim round's actions (in the order the store returned them: claim order),
    /// learns from how many came back whether the queue is deep, and resizes the buffer from
    /// what the slots took during the round trip.
    pub(crate) fn claimed(&mut self, asked: usize, claimed: Vec<ClaimedAction>) {
        self.deep = asked > 0 && claimed.len() >= asked;
        if self.starved {
            self.target = (self.target * 2).clamp(self.floor.max(1), self.capacity.max(1));
        } else if self.started * 2 < self.at_round_start {
            self.target = (self.target / 2).max(self.floor);
        }
        self.target = self.target.min(self.capacity);
        self.queue.extend(claimed);
    }

    /// The action that starts next.
    pub(crate) fn front(&self) -> Option<&ClaimedAction> {
        self.queue.front()
    }

    pub(crate) fn pop(&mut self) -> Option<ClaimedAction> {
        self.queue.pop_front()
    }

    /// Everything still buffered, in claim order (shutdown gives it back).
    pub(crate) fn take_all(&mut self) -> Vec<ClaimedAction> {
        self.queue.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use serde_json::json;

    fn action(id: i64) -> ClaimedAction {
        ClaimedAction {
            id,
            hook: "h".into(),
            args: json!({}),
            group: None,
            scheduled_at: Utc::now(),
            attempt: 1,
            max_attempts: 3,
            timeout_ms: None,
            token: 1,
        }
    }

    #[test]
    fn deep_queue_fills_slots_and_buffer_and_refills_at_half() {
        let mut p = Prefetch::new(8, 2);
        assert_eq!(p.claim_limit(4), 12, "a fresh runner assumes a backlog");
        p.claimed(12, (0..12).map(action).collect());
        assert_eq!(p.len(), 12);
        for _ in 0..4 {
            p.pop();
        }
        assert_eq!(p.claim_limit(0), 0, "buffer full: no round trip");
        for _ in 0..4 {
            p.pop();
        }
        assert_eq!(p.claim_limit(0), 4, "down to half: refill the room");
        assert_eq!(p.claim_limit(2), 6);
    }

    #[test]
    fn shallow_queue_claims_free_slots_only_and_keeps_claim_order() {
        let mut p = Prefetch::new(8, 2);
        p.claimed(12, vec![action(1), action(2)]);
        assert_eq!(p.claim_limit(3), 0, "buffered work first");
        assert_eq!(p.pop().map(|a| a.id), Some(1));
        assert_eq!(p.pop().map(|a| a.id), Some(2));
        assert_eq!(p.claim_limit(3), 3, "shallow: only the free slots");
        assert_eq!(
            p.claim_limit(0),
            0,
            "no free slot: leave the work to others"
        );
        p.claimed(3, (3..6).map(action).collect());
        assert_eq!(
            p.take_all().iter().map(|a| a.id).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert_eq!(p.claim_limit(1), 9, "a full round means deep again");
    }

    #[test]
    fn size_follows_what_the_slots_take() {
        let mut p = Prefetch::new(64, 4);
        assert_eq!(p.target(), 64);
        // Slow handlers: rounds during which little of the buffer started halve it, down to
        // the concurrency.
        for _ in 0..10 {
            p.claimed(1, (0..8).map(action).collect());
            p.round_started();
            p.started_one();
            p.claimed(1, vec![action(99)]);
            p.take_all();
        }
        assert_eq!(p.target(), 4);
        // Fast handlers: a round trip during which the buffer ran dry doubles it, up to
        // `prefetch`.
        for _ in 0..10 {
            p.round_started();
            p.ran_dry();
            p.claimed(1, vec![action(1)]);
        }
        assert_eq!(p.target(), 64);
    }

    #[test]
    fn without_prefetch_claims_are_sized_to_free_slots() {
        let mut p = Prefetch::new(0, 4);
        assert_eq!(p.claim_limit(3), 3);
        assert_eq!(p.claim_limit(0), 0);
        p.claimed(3, (0..3).map(action).collect());
        assert_eq!(p.claim_limit(2), 0, "the claimed ones start first");
        p.take_all();
        assert_eq!(p.claim_limit(2), 2);
    }
}
