//! The engine's process-local cache of packet bodies: the chunk action puts the bodies it read
//! and verified for its rows, and each child's step run looks its input up here before asking
//! the store (one store read per child less; a chunk's children usually run in the process
//! that made them, shortly after).
//!
//! Packets are content-addressed and immutable: the body stored under a hash never changes, so
//! a cached body can never be stale. The step run still checks every body against its ref
//! ([`super::packets::verify`]), cached or read.
//!
//! The cache is bounded by entries and by bytes (key and body lengths plus a fixed overhead per
//! entry), so memory stays flat whatever the size of a batch. Eviction is first in, first out:
//! a chunk's bodies are read about once each, in the order the chunk put them, so the oldest
//! entry is the one most likely consumed already (an LRU would promote consumed entries and
//! evict the ones still waiting for their child). Putting a body again moves it to the back.

use hashlink::LinkedHashMap;
use std::sync::Mutex;

/// Default bound on the bytes the cache holds (keys, bodies and the per-entry overhead).
pub const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Default bound on the number of cached bodies.
pub const DEFAULT_MAX_ENTRIES: usize = 16_384;
/// Bytes counted for each entry besides its key and body (map node, list links, string headers).
const ENTRY_OVERHEAD: usize = 96;

/// A bounded, thread-safe map from packet hash to body.
#[derive(Debug)]
pub struct PacketCache {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    map: LinkedHashMap<String, String>,
    bytes: usize,
}

fn weight(hash: &str, body: &str) -> usize {
    hash.len() + body.len() + ENTRY_OVERHEAD
}

impl Default for PacketCache {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    }
}

impl PacketCache {
    /// A cache holding at most `max_entries` bodies and `max_bytes` bytes (0 disables it).
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        PacketCache {
            max_entries,
            max_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map is consistent after every statement under the lock; a panic elsewhere while
        // holding it leaves nothing half-done.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Caches `body` under `hash`. The caller has verified that `body` is the packet `hash`
    /// names. A body too large for the bound is not cached; older entries are evicted until
    /// the new one fits.
    pub fn put(&self, hash: &str, body: &str) {
        let w = weight(hash, body);
        if self.max_entries == 0 || w > self.max_bytes {
            return;
        }
        let mut inner = self.lock();
        if let Some(old) = inner.map.remove(hash) {
            inner.bytes -= weight(hash, &old);
        }
        while !inner.map.is_empty()
            && (inner.map.len() >= self.max_entries || inner.bytes + w > self.max_bytes)
        {
            if let Some((k, v)) = inner.map.pop_front() {
                inner.bytes -= weight(&k, &v);
            }
        }
        inner.map.insert(hash.to_string(), body.to_string());
        inner.bytes += w;
    }

    /// The cached body of `hash`, if any.
    pub fn get(&self, hash: &str) -> Option<String> {
        self.lock().map.get(hash).cloned()
    }

    /// Bodies cached now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether nothing is cached.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes counted against the bound now.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl super::engine::Engine {
    /// The stored body of the packet `hash` for a step's input: from the cache when the chunk
    /// that made this child put it there, else from the store. Unverified either way (the
    /// caller verifies it against the ref).
    pub(crate) async fn input_body(&self, hash: &str) -> crate::error::Result<Option<String>> {
        if let Some(body) = self.packet_cache.get(hash) {
            return Ok(Some(body));
        }
        self.store.packet_body(hash).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> String {
        format!("{i:064x}")
    }

    #[test]
    fn returns_what_was_put_and_nothing_else() {
        let c = PacketCache::default();
        assert!(c.is_empty());
        c.put(&key(1), "{\"a\":1}");
        assert_eq!(c.get(&key(1)).as_deref(), Some("{\"a\":1}"));
        assert_eq!(c.get(&key(2)), None);
        assert_eq!(c.bytes(), weight(&key(1), "{\"a\":1}"));
    }

    #[test]
    fn entry_bound_evicts_the_oldest_first() {
        let c = PacketCache::new(3, usize::MAX);
        for i in 0..5 {
            c.put(&key(i), "{}");
            // Reads do not promote: the oldest put goes first whatever was read.
            let _ = c.get(&key(0));
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&key(0)), None);
        assert_eq!(c.get(&key(1)), None);
        for i in 2..5 {
            assert!(c.get(&key(i)).is_some(), "entry {i}");
        }
    }

    #[test]
    fn byte_bound_holds_over_many_puts() {
        let body = "x".repeat(1_000);
        let max = 10 * weight(&key(0), &body) + 10;
        let c = PacketCache::new(usize::MAX, max);
        for i in 0..10_000 {
            c.put(&key(i), &body);
            assert!(c.bytes() <= max);
        }
        assert_eq!(c.len(), 10);
        assert!(c.get(&key(9_999)).is_some());
        assert!(c.get(&key(9_989)).is_none());
    }

    #[test]
    fn put_again_replaces_without_double_counting_and_moves_to_the_back() {
        let c = PacketCache::new(2, usize::MAX);
        c.put(&key(0), "{}");
        c.put(&key(1), "{}");
        c.put(&key(0), "{}");
        assert_eq!(c.len(), 2);
        assert_eq!(c.bytes(), 2 * weight(&key(0), "{}"));
        c.put(&key(2), "{}");
        assert!(c.get(&key(0)).is_some(), "re-put entry kept");
        assert!(c.get(&key(1)).is_none(), "oldest evicted");
    }

    #[test]
    fn oversized_bodies_and_a_zero_bound_cache_nothing() {
        let c = PacketCache::new(10, 200);
        c.put(&key(0), &"y".repeat(200));
        assert!(c.is_empty());
        let off = PacketCache::new(0, DEFAULT_MAX_BYTES);
        off.put(&key(0), "{}");
        assert!(off.is_empty());
    }

    #[test]
    fn default_bound_keeps_memory_flat_over_a_million_puts() {
        let c = PacketCache::default();
        let body = r#"{"item":"feed-000000","payload":"0123456789abcdef"}"#;
        for i in 0..1_000_000 {
            c.put(&key(i), body);
        }
        assert!(c.len() <= DEFAULT_MAX_ENTRIES);
        assert!(c.bytes() <= DEFAULT_MAX_BYTES);
        assert!(c.get(&key(999_999)).is_some());
    }
}
