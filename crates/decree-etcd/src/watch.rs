//! Watching a prefix.

use etcd_client::{EventType, WatchOptions, WatchStream, Watcher};

use crate::client::{Entry, Etcd, Retry};
use crate::error::{Cause, EtcdError, Operation};

/// A change under a watched prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was written.
    Put(Entry),
    /// A key was deleted, or its lease expired or was revoked.
    Delete { key: Vec<u8>, mod_revision: i64 },
}

/// The changes under a prefix, in revision order. Dropping it cancels the watch.
pub struct PrefixWatch {
    etcd: Etcd,
    // Kept so that the watch lives as long as this value (dropping it ends the request stream).
    _watcher: Watcher,
    stream: WatchStream,
}

impl Etcd {
    /// Watches every key under `prefix`, from revision `from` when given (`Got::revision +
    /// 1` misses nothing after a read) or from now. A backup learns that the leader key is
    /// gone (its primary's lease expired or was revoked) from this, without polling.
    pub async fn watch_prefix(
        &self,
        prefix: impl Into<Vec<u8>>,
        from: Option<i64>,
    ) -> Result<PrefixWatch, EtcdError> {
        let mut options = WatchOptions::new().with_prefix();
        if let Some(revision) = from {
            options = options.with_start_revision(revision);
        }
        let prefix = prefix.into();
        let watching = |mut c: etcd_client::Client| {
            let (prefix, options) = (prefix.clone(), options.clone());
            async move { c.watch(prefix, Some(options)).await }
        };
        let (watcher, stream) = self.call(Operation::Watch, Retry::Yes, watching).await?;
        Ok(PrefixWatch { etcd: self.clone(), _watcher: watcher, stream })
    }
}

impl PrefixWatch {
    /// The next batch of changes (one revision's), waiting as long as it takes: a watch is
    /// quiet while nothing changes, so it has no request timeout. An error ends the watch:
    /// the caller reads again and watches from the revision read.
    pub async fn next(&mut self) -> Result<Vec<WatchEvent>, EtcdError> {
        loop {
            let answer = self
                .stream
                .message()
                .await
                .map_err(|e| self.etcd.error(Operation::Watch, Cause::Client(e)))?;
            let Some(answer) = answer else {
                return Err(self.etcd.error(Operation::Watch, Cause::StreamClosed));
            };
            if answer.canceled() {
                let reason =
                    format!("{} (compact revision {})", answer.cancel_reason(), answer.compact_revision());
                return Err(self.etcd.error(Operation::Watch, Cause::WatchCancelled(reason)));
            }
            let events: Vec<WatchEvent> = answer.events().iter().filter_map(to_event).collect();
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }
}

fn to_event(event: &etcd_client::Event) -> Option<WatchEvent> {
    let kv = event.kv()?;
    Some(match event.event_type() {
        EventType::Put => WatchEvent::Put(Entry::from_kv(kv)),
        EventType::Delete => WatchEvent::Delete { key: kv.key().to_vec(), mod_revision: kv.mod_revision() },
    })
}
