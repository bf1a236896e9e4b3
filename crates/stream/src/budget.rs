//! A byte budget shared by a producer thread and the tasks that drain its queues.

use std::sync::{Condvar, Mutex};

use bytes::Bytes;

/// Bounds the bytes in flight between a blocking producer and async consumers: the producer
/// waits in [`Budget::acquire`] until consumers [`Budget::release`] enough.
#[derive(Debug)]
pub(crate) struct Budget {
    cap: usize,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug)]
struct State {
    used: usize,
    closed: bool,
    /// Producers waiting in [`Budget::acquire`]: a release wakes them only if there are any
    /// (a notification costs a system call even when nobody waits, and a release comes with
    /// every message sent).
    waiting: usize,
}

/// The budget was closed: the transfer is being torn down.
#[derive(Debug)]
pub(crate) struct Closed;

impl Budget {
    pub(crate) fn new(cap: usize) -> Budget {
        Budget {
            cap: cap.max(1),
            state: Mutex::new(State {
                used: 0,
                closed: false,
                waiting: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Takes `n` bytes of the budget (at most the whole budget), blocking while it is spent.
    /// Returns how much was taken, to be given back with [`Budget::release`].
    pub(crate) fn acquire(&self, n: usize) -> Result<usize, Closed> {
        let n = n.min(self.cap);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if st.closed {
                return Err(Closed);
            }
            if st.used + n <= self.cap {
                st.used += n;
                return Ok(n);
            }
            st.waiting += 1;
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting -= 1;
        }
    }

    /// Gives back bytes taken by [`Budget::acquire`].
    pub(crate) fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.used = st.used.saturating_sub(n);
        let wake = st.waiting > 0;
        drop(st);
        if wake {
            self.cv.notify_all();
        }
    }

    /// Wakes every waiter with [`Closed`], now and from now on.
    pub(crate) fn close(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        self.cv.notify_all();
    }
}

/// Closes a budget when dropped, so that a producer never outlives an aborted transfer.
pub(crate) struct CloseOnDrop(pub(crate) std::sync::Arc<Budget>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Aborts spawned tasks when dropped, so that an aborted transfer leaves nothing running.
pub(crate) struct AbortOnDrop<T>(pub(crate) Vec<tokio::task::JoinHandle<T>>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// Buffers handed back once their bytes are written, so that the next read reuses memory
/// that is already mapped instead of faulting in fresh pages for every chunk.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

/// How many spare chunk buffers the pool keeps.
const POOL_MAX: usize = 8;

impl Pool {
    /// A buffer with room for `n` bytes.
    pub(crate) fn take(&self, n: usize) -> Vec<u8> {
        let spare = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match spare {
            Some(mut v) if v.capacity() >= n => {
                v.clear();
                v
            }
            _ => Vec::with_capacity(n),
        }
    }

    /// Takes back a buffer if nothing else holds it (the whole allocation it was cut from).
    pub(crate) fn give(&self, bytes: Bytes) {
        if let Ok(mut b) = bytes.try_into_mut() {
            // Emptied first: turning a view that does not start at its allocation's start
            // back into a Vec moves its bytes there.
            b.clear();
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < POOL_MAX {
                free.push(Vec::from(b));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits until `n` producers wait in `acquire`.
    fn until_waiting(budget: &Budget, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while budget.state.lock().unwrap().waiting != n {
            assert!(
                std::time::Instant::now() < deadline,
                "no producer came to wait"
            );
            std::thread::yield_now();
        }
    }

    /// A producer waiting for the budget is woken by a release that makes room, and by a
    /// close; releases with nobody waiting leave the count at zero.
    #[test]
    fn a_waiting_producer_wakes_on_release_and_on_close() {
        let budget = std::sync::Arc::new(Budget::new(10));
        assert_eq!(budget.acquire(10).unwrap(), 10);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let (budget, tx) = (budget.clone(), tx.clone());
            std::thread::spawn(move || tx.send(budget.acquire(5).is_ok()).unwrap())
        };
        until_waiting(&budget, 1);
        budget.release(5);
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got, Ok(true), "the release woke the producer");
        waiter.join().unwrap();
        assert_eq!(budget.state.lock().unwrap().waiting, 0);

        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || tx.send(budget.acquire(5).is_ok()).unwrap())
        };
        until_waiting(&budget, 1);
        budget.close();
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got, Ok(false), "the close woke the producer with Closed");
        waiter.join().unwrap();
    }

    /// A release that makes room for one of two waiting producers, the one that waited
    /// second, wakes it.
    #[test]
    fn a_release_wakes_the_producer_it_makes_room_for() {
        let budget = std::sync::Arc::new(Budget::new(10));
        assert_eq!(budget.acquire(10).unwrap(), 10);
        let (tx, rx) = std::sync::mpsc::channel();
        let wait_for = |n: usize| {
            let (budget, tx) = (budget.clone(), tx.clone());
            std::thread::spawn(move || tx.send((n, budget.acquire(n).is_ok())).unwrap())
        };
        let big = wait_for(8);
        until_waiting(&budget, 1);
        let small = wait_for(2);
        until_waiting(&budget, 2);
        budget.release(2);
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got, Ok((2, true)), "the small one got in");
        small.join().unwrap();
        budget.close();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok((8, false))
        );
        big.join().unwrap();
    }

    /// A chunk cut from the middle of a read block, once it is the block's last holder, gives
    /// the whole block back.
    #[test]
    fn a_view_gives_back_its_whole_allocation() {
        let pool = Pool::default();
        let block = Bytes::from(vec![1u8; 2 << 20]);
        let start = block.as_ptr();
        let mut block = block;
        let _head = block.split_to(1000);
        drop(_head);
        let chunk = block.split_to(1 << 20);
        drop(block);
        pool.give(chunk);
        let again = pool.take(2 << 20);
        assert_eq!(again.as_ptr(), start);
        assert!(again.is_empty() && again.capacity() >= 2 << 20);
    }
}
