//! Closing connections that hold a slot and ask nothing.
//!
//! A connection costs its peer one TLS handshake and then holds one of `max_connections`
//! for as long as it stays open. hyper's `header_read_timeout` covers HTTP/1 headers once a
//! request has begun, but not a client that says nothing after the handshake (the
//! connection waits to learn its protocol), nor an HTTP/2 connection without streams, which
//! keep-alive pings keep open. So the gateway counts the requests in flight on each
//! connection and closes one that has had none for `header_timeout`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's, so that a test with the clock paused sees time pass.
use tokio::time::Instant;

/// What one connection is doing: requests in flight, and when the last one ended.
pub struct Activity {
    in_flight: AtomicUsize,
    since: Mutex<Instant>,
}

/// One request in flight, from the service call until its answer (or until the request is
/// dropped): ends it on drop.
pub struct InFlight(Arc<Activity>);

impl Activity {
    /// A connection that has just been accepted: idle from now.
    pub fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        }
    }

    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// Resolves once the connection has had no request in flight for `limit`.
    pub async fn idle_for(&self, limit: Duration) {
        loop {
            let left = if self.in_flight.load(Ordering::SeqCst) > 0 {
                limit
            } else {
                limit.saturating_sub(self.last_end().elapsed())
            };
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left).await;
        }
    }

    /// Resolves once the connection has no request in flight. Looked at every 10 ms, as
    /// `idle_for` sleeps and looks again: only a connection being cut waits on it, and a
    /// wake-up for it at every request's end would cost every request.
    pub async fn quiet(&self) {
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn last_end(&self) -> Instant {
        // A poisoned lock holds a plain Instant, still whole.
        *self.since.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_only_without_a_request_in_flight() {
        let a = Arc::new(Activity::new());
        let limit = Duration::from_secs(10);
        let started = tokio::time::Instant::now();
        a.idle_for(limit).await;
        assert_eq!(started.elapsed(), limit, "idle from the accept");

        let request = a.begin();
        let idle = a.idle_for(limit);
        tokio::pin!(idle);
        // A request that takes longer than the limit keeps the connection.
        assert!(
            tokio::time::timeout(3 * limit, &mut idle).await.is_err(),
            "closed with a request in flight"
        );
        drop(request);
        let ended = tokio::time::Instant::now();
        idle.await;
        assert!(
            ended.elapsed() >= limit,
            "closed before the limit after the last request"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn quiet_once_the_last_request_ends() {
        let a = Arc::new(Activity::new());
        a.quiet().await;
        let (first, second) = (a.begin(), a.begin());
        let quiet = a.quiet();
        tokio::pin!(quiet);
        let wait = Duration::from_secs(1);
        assert!(tokio::time::timeout(wait, &mut quiet).await.is_err());
        drop(first);
        assert!(
            tokio::time::timeout(wait, &mut quiet).await.is_err(),
            "quiet with a request in flight"
        );
        drop(second);
        assert!(tokio::time::timeout(wait, quiet).await.is_ok());
    }
}
