//! The remote's folders as a push's quick check sees them: each folder listed once, when
//! the first probe for a file in it comes, and its other probes answered from that listing.
//! A rerun then asks the server a few requests per folder rather than a stat per file:
//! thousands of stats in flight cost the SSH server more than the stats themselves.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use russh_sftp::protocol::FileAttributes;
use tokio::sync::OnceCell;

use super::{Sftp, list_dir, lock};

/// Entries listed at most held at once, all folders together.
const LISTED_ENTRIES: usize = 1 << 16;

/// A folder's entries by name, with their attributes as listed (a symlink's own); `None`
/// when it could not be listed.
pub(super) type Listing = Option<Arc<HashMap<String, FileAttributes>>>;

/// The listings last taken, up to a number of entries in all (probes come in walk order, a
/// folder's together); one let go is listed again if asked for.
pub(super) struct Listings {
    held: Mutex<Held>,
}

impl Default for Listings {
    fn default() -> Self {
        Listings::holding(LISTED_ENTRIES)
    }
}

impl Listings {
    /// Listings that hold up to `most` entries (more only while the newest is bigger).
    fn holding(most: usize) -> Listings {
        Listings {
            held: Mutex::new(Held {
                by_dir: HashMap::new(),
                order: VecDeque::new(),
                entries: 0,
                most,
            }),
        }
    }

    /// The listing of remote folder `dir` (its path with the trailing `/`), listed on
    /// `sftp`, with one of its places, unless held or under way.
    pub(super) async fn of(&self, sftp: &Sftp, dir: &str) -> Listing {
        let cell = lock(&self.held).cell(dir);
        let listing = cell
            .get_or_init(|| async {
                let _place = sftp.place(true).await;
                let listed = list_dir(sftp, if dir.is_empty() { "." } else { dir }).await;
                let listing: Listing = listed.ok().map(|e| Arc::new(e.into_iter().collect()));
                lock(&self.held).listed(dir, &cell, listing.as_ref().map_or(0, |l| l.len()));
                listing
            })
            .await;
        listing.clone()
    }

    /// Remote folder `path` (no trailing `/`), just made: empty, with no need to list it.
    pub(super) fn made(&self, path: &str) {
        lock(&self.held).made(format!("{path}/"));
    }
}

/// What [`Listings`] holds.
struct Held {
    /// Each folder's listing, and its number of entries once listed.
    by_dir: HashMap<String, (Arc<OnceCell<Listing>>, usize)>,
    /// The folders in `by_dir`, oldest first.
    order: VecDeque<String>,
    /// Entries in the listings held.
    entries: usize,
    /// Entries held at most.
    most: usize,
}

impl Held {
    /// Folder `dir`'s listing: held, under way, or to be taken.
    fn cell(&mut self, dir: &str) -> Arc<OnceCell<Listing>> {
        if let Some((cell, _)) = self.by_dir.get(dir) {
            return cell.clone();
        }
        let cell = Arc::new(OnceCell::new());
        self.by_dir.insert(dir.to_string(), (cell.clone(), 0));
        self.order.push_back(dir.to_string());
        cell
    }

    /// Counts the `len` entries of the listing `cell` just took, if it is still held, and
    /// lets the oldest listings go while too many entries are held.
    fn listed(&mut self, dir: &str, cell: &Arc<OnceCell<Listing>>, len: usize) {
        match self.by_dir.get_mut(dir) {
            Some((held, counted)) if Arc::ptr_eq(held, cell) => *counted = len,
            _ => return,
        }
        self.entries += len;
        while self.entries > self.most && self.order.len() > 1 {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, counted)) = self.by_dir.remove(&oldest) {
                self.entries -= counted;
            }
        }
    }

    /// Folder `dir` is new, so empty.
    fn made(&mut self, dir: String) {
        let cell = Arc::new(OnceCell::new_with(Some(Some(Arc::default()))));
        match self.by_dir.insert(dir.clone(), (cell, 0)) {
            Some((_, counted)) => self.entries -= counted,
            None => self.order.push_back(dir),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes folder `dir`'s listing as `len` entries, as [`Listings::of`] does.
    fn list(held: &mut Held, dir: &str, len: usize) -> Arc<OnceCell<Listing>> {
        let cell = held.cell(dir);
        let entries = (0..len).map(|i| (format!("f{i}"), FileAttributes::empty()));
        cell.set(Some(Arc::new(entries.collect()))).unwrap();
        held.listed(dir, &cell, len);
        cell
    }

    fn holds(held: &Held, dir: &str) -> bool {
        held.by_dir.get(dir).is_some_and(|(c, _)| c.initialized())
    }

    #[test]
    fn the_oldest_listings_go_once_too_many_entries_are_held() {
        let mut held = Listings::holding(10).held.into_inner().unwrap();
        list(&mut held, "/a/", 4);
        list(&mut held, "/b/", 4);
        assert!(holds(&held, "/a/") && holds(&held, "/b/"));
        list(&mut held, "/c/", 4);
        assert!(!holds(&held, "/a/"), "the oldest goes");
        assert!(holds(&held, "/b/") && holds(&held, "/c/"));
        assert_eq!(held.entries, 8);

        // One let go is listed again when asked for.
        let again = held.cell("/a/");
        assert!(!again.initialized());
        list(&mut held, "/a/", 4);
        assert!(!holds(&held, "/b/"));
        assert_eq!(held.entries, 8);

        // A folder bigger than all that may be held is held alone.
        list(&mut held, "/big/", 25);
        assert!(holds(&held, "/big/"));
        assert_eq!((held.by_dir.len(), held.entries), (1, 25));
    }

    #[test]
    fn a_folder_just_made_is_empty_and_a_listing_it_replaced_is_not_counted() {
        let mut held = Listings::holding(100).held.into_inner().unwrap();
        // A probe raced ahead of the folder's making: its listing is under way (or failed).
        let racing = held.cell("/new/");
        held.made("/new/".into());
        let made = held.cell("/new/");
        assert!(made.get().unwrap().as_ref().unwrap().is_empty());
        // The listing that was under way ends, and is not counted: it is not held.
        racing
            .set(Some(Arc::new(HashMap::from([(
                "x".into(),
                FileAttributes::empty(),
            )]))))
            .unwrap();
        held.listed("/new/", &racing, 1);
        assert_eq!(held.entries, 0);
        assert!(
            held.cell("/new/")
                .get()
                .unwrap()
                .as_ref()
                .unwrap()
                .is_empty()
        );

        // Made over a listing held: its entries are no longer counted.
        list(&mut held, "/old/", 7);
        held.made("/old/".into());
        assert_eq!(held.entries, 0);
        assert_eq!(held.order.len(), 2);
    }
}
