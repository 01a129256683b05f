//! A single-flight TTL cache for the dashboard's expensive reads (the overview's capped
//! counts and throughput charts): one value per slot, reloaded when older than its TTL, and
//! while one request reloads it the others wait for that load instead of starting their own,
//! so a page refreshed by many browsers costs the database one query set per TTL.

use std::future::Future;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// One cached value.
pub(crate) struct Slot<T> {
    value: Mutex<Option<(Instant, T)>>,
}

impl<T: Clone> Slot<T> {
    /// An empty slot.
    pub(crate) fn new() -> Self {
        Self {
            value: Mutex::new(None),
        }
    }

    /// The cached value if younger than `ttl`, else the result of `load` (cached on success).
    /// A zero `ttl` always loads.
    pub(crate) async fn get<E, F, Fut>(&self, ttl: Duration, load: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut guard = self.value.lock().await;
        if let Some((at, v)) = guard.as_ref() {
            if at.elapsed() < ttl {
                return Ok(v.clone());
            }
        }
        let v = load().await?;
        *guard = Some((Instant::now(), v.clone()));
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn concurrent_readers_share_one_load_and_errors_are_not_kept() {
        let slot = Arc::new(Slot::<u32>::new());
        let loads = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (slot, loads) = (Arc::clone(&slot), Arc::clone(&loads));
            tasks.push(tokio::spawn(async move {
                slot.get(Duration::from_secs(60), || async {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Ok::<_, ()>(7)
                })
                .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), Ok(7));
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        let fresh = Slot::<u32>::new();
        assert_eq!(
            fresh
                .get(Duration::from_secs(60), || async { Err::<u32, _>("down") })
                .await,
            Err("down")
        );
        assert_eq!(
            fresh
                .get(Duration::from_secs(60), || async { Ok::<_, &str>(3) })
                .await,
            Ok(3)
        );
        assert_eq!(
            fresh
                .get(Duration::ZERO, || async { Ok::<_, &str>(4) })
                .await,
            Ok(4),
            "ttl 0 reloads"
        );
    }
}
