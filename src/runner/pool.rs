//! The claim loop of a running pool: one task that owns the prefetch buffer, starts buffered
//! actions as slots free, runs the store rounds (group-committed finishes and claims, one
//! round in flight at a time), and on shutdown gives the buffer back and settles the runs
//! (Q12).

use super::acks::{self, AckRequest, AckSender, RoundEnd, MAX_BATCH};
use super::held::{self, Held, Leases, RunSlot, Stage};
use super::prefetch::Prefetch;
use super::{lock, Runner};
use crate::store::{ClaimedAction, Finish, Lease};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

type RoundFuture = Pin<Box<dyn Future<Output = RoundEnd> + Send>>;

/// Aborts a spawned helper task when dropped (the heartbeat), so a killed pool leaves no
/// task behind.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The claim loop's state.
struct Pool {
    runner: Arc<Runner>,
    slots: Arc<Semaphore>,
    leases: Leases,
    buffer: Prefetch,
    tasks: JoinSet<()>,
    ack_tx: AckSender,
    ack_rx: mpsc::Receiver<AckRequest>,
    /// Finishes waiting for the next round.
    pending: Vec<AckRequest>,
    round: Option<RoundFuture>,
    /// The round in flight claims.
    claiming: bool,
    /// The last claim came back short: wait for a wake-up or the poll before claiming again.
    drained: bool,
    /// After a failed claim: no claim before this.
    claim_after: Option<Instant>,
    error_pause: Duration,
}

impl Runner {
    /// The claim loop; returns after `stop` turns true, the buffer is given back and
    /// in-flight work is settled.
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let (ack_tx, ack_rx) = mpsc::channel(4 * MAX_BATCH);
        let leases: Leases = Arc::default();
        let heartbeat = AbortOnDrop(tokio::spawn(
            Arc::clone(&self).heartbeat_loop(Arc::clone(&leases), ack_tx.clone()),
        ));
        let mut pool = Pool {
            slots: Arc::new(Semaphore::new(self.config.concurrency.max(1))),
            buffer: Prefetch::new(self.config.prefetch, self.config.concurrency.max(1)),
            runner: self,
            leases,
            tasks: JoinSet::new(),
            ack_tx,
            ack_rx,
            pending: Vec::new(),
            round: None,
            claiming: false,
            drained: false,
            claim_after: None,
            error_pause: Duration::from_millis(50),
        };
        let mut wake = pool.runner.store.wakeups();
        let poll_every = pool.runner.config.poll_interval;
        let poll = tokio::time::sleep(poll_every);
        tokio::pin!(poll);
        loop {
            if *stop.borrow() {
                break;
            }
            while pool.tasks.try_join_next().is_some() {}
            pool.start_buffered(None);
            if pool.claiming && pool.buffer.is_empty() && pool.slots.available_permits() > 0 {
                pool.buffer.ran_dry();
            }
            // One reading of the free slots for both decisions: a slot freed between two
            // readings once left the loop waiting on nothing (see `waits_for_slot`).
            let free = pool.slots.available_permits();
            pool.start_round(&mut wake, free);
            let want_slot = waits_for_slot(Idle {
                buffered: !pool.buffer.is_empty(),
                drained: pool.drained,
                free,
                round: pool.round.is_some(),
                paused: pool.claim_after.is_some(),
            });
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    // The handle is gone without a shutdown: stop as if asked to.
                    if changed.is_err() {
                        break;
                    }
                }
                end = poll_round(&mut pool.round), if pool.round.is_some() => {
                    pool.round = None;
                    pool.claiming = false;
                    if pool.round_ended(end) {
                        poll.as_mut().reset(Instant::now() + poll_every);
                    }
                }
                req = pool.ack_rx.recv() => {
                    if let Some(req) = req {
                        pool.pending.push(req);
                        pool.take_queued_acks();
                    }
                }
                permit = Arc::clone(&pool.slots).acquire_owned(), if want_slot => {
                    // With an empty buffer the permit only says a slot is free: the next
                    // iteration claims for it.
                    if let Ok(permit) = permit {
                        pool.start_buffered(Some(permit));
                    }
                }
                _ = wake.changed(), if pool.drained => pool.drained = false,
                _ = &mut poll, if pool.drained => pool.drained = false,
                _ = sleep_until(pool.claim_after) => pool.claim_after = None,
            }
        }
        pool.shut_down().await;
        drop(heartbeat);
    }
}

/// Awaits the round in flight (the branch is enabled only when there is one).
async fn poll_round(round: &mut Option<RoundFuture>) -> RoundEnd {
    match round.as_mut() {
        Some(r) => r.await,
        None => std::future::pending().await,
    }
}

/// What the claim loop knows when it decides what to wait for.
#[derive(Debug, Clone, Copy)]
struct Idle {
    /// Actions are buffered.
    buffered: bool,
    /// The last claim came back short (a wake-up or the poll re-enables claiming).
    drained: bool,
    /// Free slots, as read when the round was (not) started.
    free: usize,
    /// A round is in flight (its end wakes the loop).
    round: bool,
    /// Claims are paused after a failed one (a timer wakes the loop).
    paused: bool,
}

/// Whether the loop also waits for a free slot. Buffered actions need one. Otherwise a slot
/// matters when the loop could claim for it: with no round in flight, not drained and not
/// paused, nothing else would wake the loop when a run ends, because a run settled by its
/// handler's own transaction (a step finishing its job) sends no acknowledgement. So such an
/// idle loop always waits for a slot, even one that read a free slot: the slot may have been
/// free only since the round decision (that race stranded W4 runs with every run ended and
/// nothing claimed), and a slot that is free now wakes it at once.
fn waits_for_slot(s: Idle) -> bool {
    s.buffered || (!s.drained && (s.free == 0 || (!s.round && !s.paused)))
}

/// Sleeps until `at`, or forever when there is no such time.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Pool {
    /// Moves whatever else is queued into the next round (up to a batch).
    fn take_queued_acks(&mut self) {
        while self.pending.len() < MAX_BATCH {
            match self.ack_rx.try_recv() {
                Ok(r) => self.pending.push(r),
                Err(_) => break,
            }
        }
    }

    /// Starts a round when none is in flight and there are finishes to write or a claim is
    /// worth a round trip.
    fn start_round(&mut self, wake: &mut watch::Receiver<u64>, free: usize) {
        if self.round.is_some() {
            return;
        }
        let claim = if self.drained || self.claim_after.is_some() {
            0
        } else {
            self.buffer.claim_limit(free)
        };
        if claim == 0 && self.pending.is_empty() {
            return;
        }
        if claim > 0 {
            // A wake-up from now on is news to the claim after this one.
            wake.borrow_and_update();
            self.buffer.round_started();
        }
        self.claiming = claim > 0;
        let acks = std::mem::take(&mut self.pending);
        self.round = Some(Box::pin(acks::round(Arc::clone(&self.runner), acks, claim)));
    }

    /// Takes in a round's claim; returns true when the queue came back drained (the caller
    /// restarts the poll timer).
    fn round_ended(&mut self, end: RoundEnd) -> bool {
        let Some(claimed) = end.claimed else {
            return false;
        };
        match claimed {
            Ok(claimed) => {
                self.error_pause = Duration::from_millis(50);
                let short = claimed.len() < end.asked;
                self.hold(&claimed, end.lease_until);
                self.buffer.claimed(end.asked, claimed);
                self.drained = short;
                short
            }
            Err(e) => {
                tracing::warn!(error = %e, "claim failed; retrying");
                self.claim_after = Some(Instant::now() + self.error_pause);
                self.error_pause = (self.error_pause * 2).min(
                    self.runner
                        .config
                        .poll_interval
                        .max(Duration::from_millis(100)),
                );
                false
            }
        }
    }

    /// Registers freshly claimed actions as buffered.
    fn hold(&self, claimed: &[ClaimedAction], until: chrono::DateTime<chrono::Utc>) {
        let mut held = lock(&self.leases);
        for a in claimed {
            held.insert(
                a.id,
                Held {
                    lease: a.lease(),
                    until,
                    stage: Stage::Buffered,
                },
            );
        }
    }

    /// Starts buffered actions in claim order while slots are free (`permit`: one already
    /// acquired). A buffered action no longer registered (dropped by the heartbeat) is
    /// skipped; one whose lease would lapse before the next heartbeat is given back.
    fn start_buffered(&mut self, mut permit: Option<OwnedSemaphorePermit>) {
        if self.buffer.is_empty() {
            return;
        }
        let now = self.runner.clock.now();
        let margin = self.runner.lapse_margin();
        let mut held = lock(&self.leases);
        while let Some(next) = self.buffer.front() {
            let lease = next.lease();
            let until = match held.get(&lease.id) {
                Some(h) if h.lease == lease && matches!(h.stage, Stage::Buffered) => h.until,
                _ => {
                    self.buffer.pop();
                    continue;
                }
            };
            if !held::startable(until, now, margin) {
                held.remove(&lease.id);
                self.buffer.pop();
                tracing::info!(
                    action_id = lease.id,
                    "buffered lease would lapse before it starts; giving it back"
                );
                self.pending.push(held::release_request(lease));
                continue;
            }
            let permit = match permit.take() {
                Some(p) => p,
                None => match Arc::clone(&self.slots).try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let Some(action) = self.buffer.pop() else {
                break;
            };
            self.buffer.started_one();
            crate::failpoint::crash("runner.after_claim");
            let runner = Arc::clone(&self.runner);
            let registry = Arc::clone(&self.leases);
            let acker = self.ack_tx.clone();
            let slot = RunSlot {
                _permit: permit,
                leases: Arc::clone(&self.leases),
                id: lease.id,
            };
            // Spawned under the registry lock, so the run cannot end before it is marked
            // running.
            let handle = self.tasks.spawn(async move {
                runner.execute(action, Some(&acker), Some(slot)).await;
                let mut held = lock(&registry);
                if held.get(&lease.id).is_some_and(|h| h.lease == lease) {
                    held.remove(&lease.id);
                }
            });
            if let Some(h) = held.get_mut(&lease.id) {
                h.stage = Stage::Running(handle);
            }
        }
    }

    /// Q12: finish the round in flight, give the buffer back, let in-flight handlers finish
    /// up to the deadline (serving their finishes), then stop the rest and give their leases
    /// back.
    async fn shut_down(mut self) {
        if let Some(round) = self.round.take() {
            let end = round.await;
            self.round_ended(end);
        }
        let buffered: Vec<Lease> = {
            let mut held = lock(&self.leases);
            self.buffer
                .take_all()
                .into_iter()
                .map(|a| a.lease())
                .filter(|l| {
                    let ours = held
                        .get(&l.id)
                        .is_some_and(|h| h.lease == *l && matches!(h.stage, Stage::Buffered));
                    if ours {
                        held.remove(&l.id);
                    }
                    ours
                })
                .collect()
        };
        if !buffered.is_empty() {
            tracing::info!(
                count = buffered.len(),
                "giving buffered actions back at shutdown"
            );
        }
        self.pending
            .extend(buffered.into_iter().map(held::release_request));
        self.flush().await;
        let deadline = Instant::now() + self.runner.config.shutdown_timeout;
        let mut stopped: Vec<Lease> = Vec::new();
        let mut timed_out = false;
        while !self.tasks.is_empty() {
            tokio::select! {
                biased;
                req = self.ack_rx.recv() => {
                    if let Some(req) = req {
                        self.pending.push(req);
                        self.take_queued_acks();
                        self.flush().await;
                    }
                }
                joined = self.tasks.join_next() => {
                    if joined.is_none() {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(deadline), if !timed_out => {
                    timed_out = true;
                    stopped = self.abort_running();
                }
            }
        }
        // Runs whose handler was stopped give their lease back, uncounted.
        for lease in stopped {
            match self
                .runner
                .store
                .finish(lease, &Finish::Release, self.runner.clock.now())
                .await
            {
                Ok(_) => tracing::info!(action_id = lease.id, "lease given back at shutdown"),
                Err(e) => {
                    tracing::warn!(action_id = lease.id, error = %e, "could not give lease back; the reaper will")
                }
            }
        }
        // Give-backs the heartbeat queued meanwhile.
        self.take_queued_acks();
        self.flush().await;
    }

    /// Aborts the runs whose handler is still running; returns their leases.
    fn abort_running(&self) -> Vec<Lease> {
        let held = lock(&self.leases);
        held.values()
            .filter_map(|h| match &h.stage {
                Stage::Running(handle) => {
                    handle.abort();
                    Some(h.lease)
                }
                _ => None,
            })
            .collect()
    }

    /// Writes the pending finishes now (a round without a claim).
    async fn flush(&mut self) {
        while !self.pending.is_empty() {
            let batch: Vec<AckRequest> = if self.pending.len() > MAX_BATCH {
                self.pending.drain(..MAX_BATCH).collect()
            } else {
                std::mem::take(&mut self.pending)
            };
            acks::round(Arc::clone(&self.runner), batch, 0).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{waits_for_slot, Idle};

    /// Every state the loop can wait in has a waker: the round's end, a wake-up or the poll
    /// (drained), the pause timer, or a free slot. Acknowledgements are not counted: a run
    /// settled by its own transaction sends none.
    #[test]
    fn an_idle_loop_always_has_a_waker() {
        for bits in 0..16u8 {
            for free in 0..3 {
                let s = Idle {
                    buffered: bits & 1 != 0,
                    drained: bits & 2 != 0,
                    free,
                    round: bits & 4 != 0,
                    paused: bits & 8 != 0,
                };
                let woken = s.round || s.drained || s.paused || waits_for_slot(s);
                assert!(woken, "no waker in {s:?}");
            }
        }
    }

    /// The W4 stall: no slot was free when the round was decided (so none started), one came
    /// free before the wait; the loop must still wait for it.
    #[test]
    fn a_slot_freed_after_the_round_decision_wakes_the_loop() {
        let s = Idle {
            buffered: false,
            drained: false,
            free: 1,
            round: false,
            paused: false,
        };
        assert!(waits_for_slot(s));
    }

    #[test]
    fn a_busy_or_drained_loop_does_not_spin_on_free_slots() {
        let base = Idle {
            buffered: false,
            drained: false,
            free: 2,
            round: true,
            paused: false,
        };
        assert!(!waits_for_slot(base), "a round in flight wakes the loop");
        assert!(!waits_for_slot(Idle {
            round: false,
            drained: true,
            ..base
        }));
        assert!(!waits_for_slot(Idle {
            round: false,
            paused: true,
            ..base
        }));
        assert!(waits_for_slot(Idle {
            buffered: true,
            ..base
        }));
    }
}
