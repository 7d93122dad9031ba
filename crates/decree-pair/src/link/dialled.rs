//! A primary's link listener: it keeps the link address its member listened on as a
//! backup, and answers whoever dials it with [`Leader::on_dialled`]. Only a member that
//! believes it leads dials, so the dialler and this member cannot both be right: the one of
//! the older epoch learns of the newer at its first contact and steps down (issue 32,
//! defects 8 to 10). Each connection is checked by the transport (TLS with the pair's
//! certificates) before its `Hello` is read, is given `OPENING_TIMEOUT` in all, and at most
//! `OPENINGS_MAX` are answered at once; none becomes a link.

use super::follower::{OPENINGS_MAX, OPENING_TIMEOUT};
use super::leader::Leader;
use super::read_message;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

impl Leader {
    /// Answers the members that dial `listener` until `stop`, or until this member no
    /// longer leads.
    pub async fn listen(self: Arc<Self>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
        let openings = Arc::new(Semaphore::new(OPENINGS_MAX));
        loop {
            let (stream, from) = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "the primary's link listener could not accept");
                        continue;
                    }
                },
            };
            if self.node().leads().is_none() {
                return;
            }
            let Ok(permit) = openings.clone().try_acquire_owned() else {
                tracing::warn!(%from, "a dialling member refused: {OPENINGS_MAX} answers already under way");
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move {
                if tokio::time::timeout(OPENING_TIMEOUT, me.answer(stream, from)).await.is_err() {
                    tracing::warn!(%from, "a dialling member said nothing within {OPENING_TIMEOUT:?}");
                }
                drop(permit);
            });
        }
    }

    /// Reads a dialling member's `Hello` through the transport's checks and answers it.
    async fn answer(&self, stream: TcpStream, from: SocketAddr) {
        super::tune(&stream);
        let stream = match self.transport().accept(stream, from).await {
            Ok(stream) => stream,
            Err(why) => {
                tracing::warn!(%from, "a dialling member refused: {why}");
                return;
            }
        };
        let (mut reader, mut writer) = tokio::io::split(stream);
        let mut buf = Vec::new();
        let message = match read_message(&mut reader, &mut buf, self.transport().as_ref()).await {
            Ok(message) => message,
            Err(end) => {
                tracing::info!(%from, "a dialling member left: {end}");
                return;
            }
        };
        let step = self.on_dialled(message);
        let mut out = Vec::new();
        for frame in &step.send {
            frame.encode(&mut out);
        }
        let _ = writer.write_all(&out).await;
        let _ = writer.shutdown().await;
        if let Some(end) = step.end {
            tracing::warn!(%from, "a member dialled this primary: {end}");
        }
    }
}
