//! Group commit of single writes from concurrent callers (leader/follower, no timer): each
//! caller queues its item, then either finds its result written by another caller or takes
//! the write lock itself and writes everything queued in one call of the batch writer. A lone
//! caller writes its own item at once, inline; under contention a commit carries every item
//! queued while the previous one was being written. Every caller returns only after the write
//! that carried its item has returned (for a store: committed).
//!
//! A batch of more than one item is written on a spawned task, so a leader whose future is
//! dropped mid-write cannot drop its followers' items with it.

use crate::error::{Error, Result};
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

type Waiter<T, R> = (T, oneshot::Sender<Result<R>>);

/// Queued items and the lock whose holder writes them.
pub(crate) struct GroupCommit<T, R> {
    queue: Arc<Mutex<Vec<Waiter<T, R>>>>,
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl<T, R> Default for GroupCommit<T, R> {
    fn default() -> Self {
        Self {
            queue: Arc::default(),
            writer: Arc::default(),
        }
    }
}

impl<T, R> std::fmt::Debug for GroupCommit<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

fn lock<V>(m: &Mutex<V>) -> std::sync::MutexGuard<'_, V> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Send + 'static, R: Send + 'static> GroupCommit<T, R> {
    /// Writes `item` together with whatever other callers queued meanwhile. `write` gets the
    /// items in queue order and returns one result per item, in the same order.
    pub(crate) async fn submit<W, Fut>(&self, item: T, write: W) -> Result<R>
    where
        W: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<R>>> + Send + 'static,
    {
        let (tx, mut rx) = oneshot::channel();
        lock(&self.queue).push((item, tx));
        let write = Arc::new(write);
        loop {
            tokio::select! {
                biased;
                r = &mut rx => {
                    return r.unwrap_or_else(|_| {
                        Err(Error::Config("group commit: the write carrying this item was interrupted".into()))
                    });
                }
                guard = Arc::clone(&self.writer).lock_owned() => {
                    // One yield before taking the queue: callers made ready together (a
                    // chunk's children ending at once) queue their items first, so they
                    // share this write instead of the leader writing alone.
                    tokio::task::yield_now().await;
                    let batch = std::mem::take(&mut *lock(&self.queue));
                    if batch.is_empty() {
                        // Another caller took ours; its answer is on the way.
                        drop(guard);
                        continue;
                    }
                    if batch.len() == 1 {
                        deliver(batch, &*write).await;
                        drop(guard);
                        continue;
                    }
                    let write = Arc::clone(&write);
                    let task = tokio::spawn(async move {
                        deliver(batch, &*write).await;
                        drop(guard);
                    });
                    let _ = task.await;
                }
            }
        }
    }
}

/// Writes a batch and answers each waiter.
async fn deliver<T, R, W, Fut>(batch: Vec<Waiter<T, R>>, write: &W)
where
    W: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = Vec<Result<R>>>,
{
    let (items, waiters): (Vec<T>, Vec<oneshot::Sender<Result<R>>>) = batch.into_iter().unzip();
    let n = items.len();
    let mut results = write(items).await.into_iter();
    for (i, waiter) in waiters.into_iter().enumerate() {
        let r = results.next().unwrap_or_else(|| {
            Err(Error::Config(format!(
                "group commit: the batch writer answered fewer than {n} items (item {i})"
            )))
        });
        let _ = waiter.send(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_callers_share_writes_and_each_gets_its_own_result() {
        let gc: Arc<GroupCommit<u32, u32>> = Arc::default();
        let writes = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..200u32 {
            let (gc, writes) = (Arc::clone(&gc), Arc::clone(&writes));
            tasks.push(tokio::spawn(async move {
                gc.submit(i, move |items: Vec<u32>| {
                    let writes = Arc::clone(&writes);
                    async move {
                        writes.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        items.into_iter().map(|x| Ok(x * 2)).collect()
                    }
                })
                .await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap().unwrap(), i as u32 * 2);
        }
        assert!(writes.load(Ordering::SeqCst) <= 200);
    }

    #[tokio::test]
    async fn a_short_answer_is_an_error_for_the_unanswered() {
        let gc: GroupCommit<u32, u32> = GroupCommit::default();
        let r = gc.submit(1, |_items: Vec<u32>| async { Vec::new() }).await;
        assert!(r.is_err());
    }
}
