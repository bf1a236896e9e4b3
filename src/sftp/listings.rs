//! The remote's folders as a push's quick check sees them: each folder of the copy listed
//! once, when the first probe for a file in it comes, and its other probes answered from
//! that listing. A rerun then asks the server a few requests per folder rather than a stat
//! per file: thousands of stats in flight cost the SSH server more than the stats
//! themselves.
//!
//! A listing is trusted for the names it holds, with their attributes as OpenSSH's server
//! lists them (a symlink's own). A name it lacks is asked about with a stat all the same: a
//! name the server spells otherwise (not UTF-8, or normalised) would be missed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use russh_sftp::protocol::FileAttributes;
use tokio::sync::OnceCell;

use super::{Sftp, is_single_name, list_dir, lock};

/// Folders and entries held, all listings together (a folder counts one more): past this,
/// the oldest are let go, though not those under way, the newest, or the folders it is in.
const LISTED_ENTRIES: usize = 1 << 16;

/// Listings under way at once on each session, these and the stale-temp sweeps' together:
/// each holds a handle, and a push keeps its handles on a session below 128 (see
/// `PUSH_FILES_IN_FLIGHT`).
pub(super) const LISTINGS_AT_ONCE: usize = 8;

/// What a folder holds, as far as a probe can tell.
#[derive(Debug)]
pub(super) enum Folder {
    /// Made by this push: nothing was there.
    Made,
    /// Its entries by name, as listed.
    Listed(HashMap<String, FileAttributes>),
}

/// What a folder's listing says of one name.
pub(super) enum Seen<'a> {
    /// Listed, with these attributes.
    Listed(&'a FileAttributes),
    /// Not there: the folder is new.
    Absent,
    /// Not known: not listed, or the folder could not be listed.
    Unknown,
}

impl Folder {
    /// A folder's listing as the server gave it, but for names that cannot be one of its
    /// entries as given (a name not UTF-8 comes as U+FFFD): those are asked about instead.
    fn listed(entries: Vec<(String, FileAttributes)>) -> Folder {
        let named = entries.into_iter().filter(|(name, _)| is_single_name(name));
        Folder::Listed(named.collect())
    }

    /// What this folder holds under `name`.
    pub(super) fn seen<'a>(folder: Option<&'a Folder>, name: &str) -> Seen<'a> {
        match folder {
            Some(Folder::Made) => Seen::Absent,
            Some(Folder::Listed(entries)) => entries.get(name).map_or(Seen::Unknown, Seen::Listed),
            None => Seen::Unknown,
        }
    }

    fn len(&self) -> usize {
        match self {
            Folder::Made => 0,
            Folder::Listed(entries) => entries.len(),
        }
    }
}

/// A folder's listing; `None` when it could not be listed.
type Listing = Option<Arc<Folder>>;

/// The listings last taken (probes come in walk order, a folder's mostly together); one let
/// go is listed again if asked for.
pub(super) struct Listings {
    held: Mutex<Held>,
}

impl Default for Listings {
    fn default() -> Self {
        Listings::holding(LISTED_ENTRIES)
    }
}

impl Listings {
    /// Listings that hold up to `most` folders and entries.
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
    /// `sftp` (one of its listing places held meanwhile) unless held or under way.
    pub(super) async fn of(&self, sftp: &Sftp, dir: &str) -> Listing {
        let cell = lock(&self.held).cell(dir);
        let listing = cell
            .get_or_init(|| async {
                let _place = sftp.listing_places.acquire().await;
                let listed = list_dir(sftp, dir).await;
                let listing = listed.ok().map(|entries| Arc::new(Folder::listed(entries)));
                let len = listing.as_ref().map_or(0, |f| f.len());
                lock(&self.held).listed(dir, &cell, len);
                listing
            })
            .await;
        listing.clone()
    }

    /// Remote folder `path` (no trailing `/`), just made: empty, with no need to list it.
    pub(super) fn made(&self, path: &str) {
        lock(&self.held).made(format!("{path}/"));
    }

    /// Remote folder `dir` (with its trailing `/`) if this push made it.
    pub(super) fn was_made(&self, dir: &str) -> bool {
        let held = lock(&self.held);
        let made = held.by_dir.get(dir).and_then(|(cell, _)| cell.get());
        matches!(made, Some(Some(folder)) if matches!(**folder, Folder::Made))
    }
}

/// What [`Listings`] holds.
struct Held {
    /// Each folder's listing, and what it counts once listed (one, and its entries).
    by_dir: HashMap<String, (Arc<OnceCell<Listing>>, usize)>,
    /// The folders in `by_dir`, oldest first.
    order: VecDeque<String>,
    /// What the listings held count, all together.
    entries: usize,
    /// What they may count at most.
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
    /// lets the oldest go while too much is held.
    fn listed(&mut self, dir: &str, cell: &Arc<OnceCell<Listing>>, len: usize) {
        match self.by_dir.get_mut(dir) {
            Some((held, counted)) if Arc::ptr_eq(held, cell) => *counted = 1 + len,
            _ => return,
        }
        self.entries += 1 + len;
        self.let_go(dir);
    }

    /// Lets the oldest listings go while too much is held: not those under way, and not
    /// `dir` or the folders it is in, which the walk comes back to.
    fn let_go(&mut self, dir: &str) {
        let mut kept = VecDeque::new();
        while self.entries > self.most
            && let Some(oldest) = self.order.pop_front()
        {
            let (held, counted) = &self.by_dir[&oldest];
            if dir.starts_with(&oldest) || !held.initialized() {
                kept.push_back(oldest);
                continue;
            }
            self.entries -= counted;
            self.by_dir.remove(&oldest);
        }
        kept.append(&mut self.order);
        self.order = kept;
    }

    /// Folder `dir` is new, so empty.
    fn made(&mut self, dir: String) {
        let cell = Arc::new(OnceCell::new_with(Some(Some(Arc::new(Folder::Made)))));
        match self.by_dir.insert(dir.clone(), (cell, 1)) {
            Some((_, counted)) => self.entries = self.entries - counted + 1,
            None => {
                self.entries += 1;
                self.order.push_back(dir.clone());
            }
        }
        self.let_go(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes folder `dir`'s listing as `len` entries, as [`Listings::of`] does.
    fn list(held: &mut Held, dir: &str, len: usize) -> Arc<OnceCell<Listing>> {
        let cell = held.cell(dir);
        let entries = (0..len).map(|i| (format!("f{i}"), FileAttributes::empty()));
        cell.set(Some(Arc::new(Folder::Listed(entries.collect()))))
            .unwrap();
        held.listed(dir, &cell, len);
        cell
    }

    fn holds(held: &Held, dir: &str) -> bool {
        held.by_dir.get(dir).is_some_and(|(c, _)| c.initialized())
    }

    #[test]
    fn the_oldest_listings_go_once_too_much_is_held() {
        let mut held = Listings::holding(10).held.into_inner().unwrap();
        list(&mut held, "/a/", 3);
        list(&mut held, "/b/", 3);
        assert!(holds(&held, "/a/") && holds(&held, "/b/"));
        list(&mut held, "/c/", 3);
        assert!(!holds(&held, "/a/"), "the oldest goes");
        assert!(holds(&held, "/b/") && holds(&held, "/c/"));
        assert_eq!(held.entries, 8);

        // One let go is listed again when asked for.
        let again = held.cell("/a/");
        assert!(!again.initialized());
        list(&mut held, "/a/", 3);
        assert!(!holds(&held, "/b/"));
        assert_eq!(held.entries, 8);

        // A folder bigger than all that may be held is held alone.
        list(&mut held, "/big/", 25);
        assert!(holds(&held, "/big/"));
        assert_eq!((held.by_dir.len(), held.entries), (1, 26));
        assert_eq!(held.order, ["/big/"]);
    }

    #[test]
    fn the_folders_a_listing_is_in_and_those_under_way_stay() {
        let mut held = Listings::holding(10).held.into_inner().unwrap();
        list(&mut held, "/t/", 4);
        let under_way = held.cell("/u/");
        list(&mut held, "/x/", 2);
        // The walk went down into a big folder of /t/: /t/ stays for the rest of its
        // probes, and so does /u/, still being listed; /x/ goes.
        list(&mut held, "/t/big/", 6);
        assert!(holds(&held, "/t/") && holds(&held, "/t/big/"));
        assert!(held.by_dir.contains_key("/u/") && !under_way.initialized());
        assert!(!held.by_dir.contains_key("/x/"));
        assert_eq!(held.order, ["/t/", "/u/", "/t/big/"]);
        assert_eq!(held.entries, 5 + 7);
    }

    #[test]
    fn folders_just_made_are_empty_counted_and_let_go_too() {
        let mut held = Listings::holding(4).held.into_inner().unwrap();
        // A probe raced ahead of the folder's making: its listing is under way (or failed).
        let racing = held.cell("/new/");
        held.made("/new/".into());
        let made = held.cell("/new/");
        let folder = made.get().unwrap().as_deref();
        assert!(matches!(Folder::seen(folder, "x"), Seen::Absent));
        // The listing that was under way ends, and is not counted: it is not held.
        let listed = HashMap::from([("x".into(), FileAttributes::empty())]);
        racing.set(Some(Arc::new(Folder::Listed(listed)))).unwrap();
        held.listed("/new/", &racing, 1);
        assert_eq!(held.entries, 1);

        // Made over a listing held: its entries are no longer counted.
        list(&mut held, "/old/", 2);
        held.made("/old/".into());
        assert_eq!(held.entries, 2);
        // Many folders made: the oldest go, as listings do.
        for i in 0..10 {
            held.made(format!("/m{i}/"));
        }
        assert_eq!(
            (held.entries, held.by_dir.len(), held.order.len()),
            (4, 4, 4)
        );
    }

    #[test]
    fn a_name_the_server_could_not_give_as_it_is_is_asked_about() {
        // `a\xe9` on the remote comes as `a\u{FFFD}`: it must not answer for a source
        // file of that name.
        let entries = ["ok", "a\u{FFFD}", "x/y", ""].map(|n| (n.into(), FileAttributes::empty()));
        let folder = Folder::listed(entries.into());
        assert!(matches!(Folder::seen(Some(&folder), "ok"), Seen::Listed(_)));
        for name in ["a\u{FFFD}", "x/y", ""] {
            assert!(
                matches!(Folder::seen(Some(&folder), name), Seen::Unknown),
                "{name:?}"
            );
        }
    }

    #[test]
    fn a_listing_answers_for_the_names_it_holds_only() {
        let listed = Folder::Listed(HashMap::from([("a".into(), FileAttributes::empty())]));
        assert!(matches!(Folder::seen(Some(&listed), "a"), Seen::Listed(_)));
        // Perhaps spelled otherwise by the server: asked about.
        assert!(matches!(Folder::seen(Some(&listed), "b"), Seen::Unknown));
        assert!(matches!(Folder::seen(None, "a"), Seen::Unknown));
        assert!(matches!(
            Folder::seen(Some(&Folder::Made), "a"),
            Seen::Absent
        ));
    }
}
