//! [`LocalComm`]: a group of ranks inside one process, one per thread, for tests of the
//! collectives without MPI.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::Duration;

use super::Collective;
use crate::error::RuntimeError;

/// How long a receive waits before it reports the ranks as stuck.
const PATIENCE: Duration = Duration::from_secs(120);

/// One rank of an in-process group made by [`LocalComm::group`]: messages go through unbounded
/// channels (one per ordered pair of ranks), so a send never blocks and `sendrecv` is a send then
/// a receive. Give each rank its own thread; [`abort`](Collective::abort) panics.
pub struct LocalComm {
    rank: usize,
    world: usize,
    /// `to[p]`: the channel to rank `p`.
    to: Vec<Sender<Vec<u8>>>,
    /// `from[p]`: the channel from rank `p`.
    from: Vec<Mutex<Receiver<Vec<u8>>>>,
    /// Bytes sent so far ([`Collective::sent_bytes`]).
    sent: std::sync::atomic::AtomicU64,
}

impl LocalComm {
    /// The `world` ranks of a new group, rank `r` at index `r`.
    pub fn group(world: usize) -> Vec<LocalComm> {
        // chans[a][b]: a -> b
        let mut senders: Vec<Vec<Sender<Vec<u8>>>> = (0..world).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<Mutex<Receiver<Vec<u8>>>>> =
            (0..world).map(|_| Vec::new()).collect();
        for s in senders.iter_mut() {
            for r in receivers.iter_mut() {
                let (tx, rx) = channel();
                s.push(tx);
                r.push(Mutex::new(rx));
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (to, from))| LocalComm {
                rank,
                world,
                to,
                from,
                sent: Default::default(),
            })
            .collect()
    }

    fn check_peer(&self, what: &str, peer: usize) -> Result<(), RuntimeError> {
        if peer >= self.world {
            return Err(RuntimeError::Comm(format!(
                "{what}: rank {peer} does not exist in a group of {} ranks (a bug in the caller)",
                self.world
            )));
        }
        Ok(())
    }
}

impl Collective for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn describe(&self) -> String {
        format!("threads ({} ranks in one process)", self.world)
    }
    fn sendrecv(
        &self,
        send: &[u8],
        to: usize,
        recv: &mut [u8],
        from: usize,
    ) -> Result<(), RuntimeError> {
        self.send(send, to)?;
        self.recv(recv, from)
    }
    fn sent_bytes(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn send(&self, data: &[u8], to: usize) -> Result<(), RuntimeError> {
        self.check_peer("send", to)?;
        self.sent
            .fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.to[to].send(data.to_vec()).map_err(|_| {
            RuntimeError::Comm(format!(
                "rank {} cannot send {} bytes to rank {to}: that rank has ended (its thread \
                 stopped early; see its error)",
                self.rank,
                data.len()
            ))
        })
    }
    fn recv(&self, data: &mut [u8], from: usize) -> Result<(), RuntimeError> {
        self.check_peer("recv", from)?;
        let rx = self.from[from].lock().map_err(|_| {
            RuntimeError::Comm(format!(
                "rank {}: the channel from rank {from} is poisoned (a thread panicked)",
                self.rank
            ))
        })?;
        let msg = rx.recv_timeout(PATIENCE).map_err(|e| {
            RuntimeError::Comm(match e {
                RecvTimeoutError::Timeout => format!(
                    "rank {} waited {} s for {} bytes from rank {from}: the ranks' calls do not \
                     match (every rank must call the same collectives in the same order)",
                    self.rank,
                    PATIENCE.as_secs(),
                    data.len()
                ),
                RecvTimeoutError::Disconnected => format!(
                    "rank {} expected {} bytes from rank {from}, but that rank has ended (its \
                     thread stopped early; see its error)",
                    self.rank,
                    data.len()
                ),
            })
        })?;
        if msg.len() != data.len() {
            return Err(RuntimeError::Comm(format!(
                "rank {} expected {} bytes from rank {from} but got {}: the ranks' calls do not \
                 match (every rank must call the same collectives with the same sizes)",
                self.rank,
                data.len(),
                msg.len()
            )));
        }
        data.copy_from_slice(&msg);
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        panic!(
            "rank {} of {} aborted with code {code}",
            self.rank, self.world
        )
    }
}
