//! A TCP relay on loopback that can leave its connections half-open: the fault a peer
//! that dies without closing (a host gone, a partition) or a network that drops every
//! packet makes, which no signal to a local process reproduces (a stopped MariaDB's
//! kernel still completes handshakes and acknowledges bytes, and SIGCONT ends it). Or
//! that drops a connection at a chosen request: the first time a client sends a given
//! byte string (an argument only that request carries), as a connection lost mid-work
//! would be. Or that holds each client's bytes back a while: a slow server or path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Relays each connection to `target` until [`stall_open_connections`]; dropped, it
/// closes every connection it holds. On a thread and runtime of its own, as a network
/// would be: what the core's runtime does never holds its bytes up.
///
/// [`stall_open_connections`]: StallingRelay::stall_open_connections
pub struct StallingRelay {
    pub port: u16,
    stalls: watch::Sender<u64>,
    cut: Arc<Cut>,
    /// How long each client's bytes are held before they are passed on, in ms.
    delay_ms: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The byte string whose first sending drops its connection, and how many times it was
/// sent since it was set.
#[derive(Default)]
struct Cut {
    marker: Mutex<Option<Vec<u8>>>,
    seen: AtomicUsize,
}

/// The longest marker: each connection keeps this many of its client's last bytes, for
/// a marker split across two reads.
const MARKER_MAX: usize = 64;

impl StallingRelay {
    pub async fn start(target: SocketAddr) -> StallingRelay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stalls, watch) = watch::channel(0u64);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let cut = Arc::new(Cut::default());
        let cutting = cut.clone();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delaying = delay_ms.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                // Every connection is a task of this runtime: it ends (and they close)
                // when the relay is dropped.
                let accept = async {
                    while let Ok((client, _)) = listener.accept().await {
                        tokio::spawn(relay(
                            client,
                            target,
                            watch.clone(),
                            cutting.clone(),
                            delaying.clone(),
                        ));
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        });
        StallingRelay {
            port,
            stalls,
            cut,
            delay_ms,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Points a core's `settings` at this relay instead of MariaDB on `direct_port`.
    pub fn carry_mysql_of(&self, settings: &mut stampede_core::Settings, direct_port: u16) {
        let (direct, relayed) = (format!(":{direct_port}/"), format!(":{}/", self.port));
        let url = &mut settings.mysql.url;
        assert!(url.contains(&direct), "{url}");
        *url = url.replace(&direct, &relayed);
    }

    /// Every connection open now stops carrying bytes, either way, and stays open: its
    /// ends wait for an answer that never comes. Connections opened later are relayed.
    pub fn stall_open_connections(&self) {
        self.stalls.send_modify(|n| *n += 1);
    }

    /// From now on, every connection's client bytes (open ones' too) are held `delay`
    /// before they are passed on: a request is answered that much later.
    pub fn delay_client_bytes(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap();
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// From now on, the first connection to send `marker` (at most 64 bytes) is dropped,
    /// both ways, before the bytes it came in are relayed; later ones are relayed.
    pub fn cut_when_sent(&self, marker: &[u8]) {
        assert!(!marker.is_empty() && marker.len() <= MARKER_MAX);
        *self.cut.marker.lock().unwrap() = Some(marker.to_vec());
        self.cut.seen.store(0, Ordering::SeqCst);
    }

    /// How many times clients sent the marker since [`cut_when_sent`] (the first one
    /// cut).
    ///
    /// [`cut_when_sent`]: StallingRelay::cut_when_sent
    pub fn marker_sent(&self) -> usize {
        self.cut.seen.load(Ordering::SeqCst)
    }
}

impl Drop for StallingRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn relay(
    mut client: TcpStream,
    target: SocketAddr,
    mut stalls: watch::Receiver<u64>,
    cut: Arc<Cut>,
    delay_ms: Arc<AtomicU64>,
) {
    let born = *stalls.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut carry: Vec<u8> = Vec::new();
    loop {
        tokio::select! {
            read = client.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if cut.first_sent_in(&mut carry, &up[..n]) {
                        return; // both sockets dropped: the connection is lost
                    }
                    let delay = delay_ms.load(Ordering::SeqCst);
                    if delay > 0 {
                        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                    }
                    if server.write_all(&up[..n]).await.is_err() { return }
                }
            },
            read = server.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if client.write_all(&down[..n]).await.is_err() { return },
            },
            changed = stalls.changed() => {
                if changed.is_err() || *stalls.borrow() > born {
                    // Half-open from now on: both sockets held, nothing read or written.
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

impl Cut {
    /// Counts the marker's occurrences that end in `bytes` (`carry`: the connection's
    /// bytes before them, kept to [`MARKER_MAX`]); true if the first one since the
    /// marker was set is among them.
    fn first_sent_in(&self, carry: &mut Vec<u8>, bytes: &[u8]) -> bool {
        let from = carry.len();
        carry.extend_from_slice(bytes);
        let mut first = false;
        if let Some(marker) = self.marker.lock().unwrap().as_deref() {
            let m = marker.len();
            for end in (from + 1).max(m)..=carry.len() {
                if carry[end - m..end] == *marker && self.seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    first = true;
                }
            }
        }
        let keep = carry.len().saturating_sub(MARKER_MAX - 1);
        carry.drain(..keep);
        first
    }
}
