//! Shutdown: one signal that every listener, worker and periodic job watches.

use tokio::sync::watch;

/// Tells a running core to stop; cheap to clone.
#[derive(Clone)]
pub struct Stopper(watch::Sender<bool>);

impl Stopper {
    pub fn new() -> Stopper {
        Stopper(watch::channel(false).0)
    }

    pub fn stop(&self) {
        let _ = self.0.send(true);
    }

    /// A watcher of this signal, one per task.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

impl Default for Stopper {
    fn default() -> Self {
        Stopper::new()
    }
}

/// A task's view of the stop signal.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// True once the stop was given.
    pub fn requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the stop is given (or its sender is gone).
    pub async fn wait(&mut self) {
        // wait_for's guard is not Send; drop it here, before the caller awaits anything else.
        let _ = self.0.wait_for(|stopped| *stopped).await.map(|_| ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_watcher_sees_the_stop() {
        let stopper = Stopper::new();
        let (mut a, b) = (stopper.subscribe(), stopper.subscribe());
        assert!(!b.requested());
        stopper.stop();
        a.wait().await;
        assert!(b.requested());
    }
}
