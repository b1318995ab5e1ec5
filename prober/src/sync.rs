//! Leaf helpers for shared state (no imports from the rest of the crate).

use std::sync::{Mutex, MutexGuard};

/// Locks a std mutex, using the data of a poisoned one: every mutex in the prober guards
/// plain data (maps, counters) that a panicking holder leaves consistent enough to read
/// and keep updating, and a prober that stopped measuring over a poisoned lock would
/// lose more than the one update.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
