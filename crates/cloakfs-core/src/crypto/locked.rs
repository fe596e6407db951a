//! Locked memory for keys and key schedules.
//!
//! Every key and key schedule cloakfs keeps lives in a slot of a page that holds secrets and
//! nothing else. Pages are mapped anonymously, a region at a time, locked into RAM (mlock) and
//! left out of core dumps (MADV_DONTDUMP) when mapped, and stay locked for as long as they are
//! mapped. A page counts its live slots and is unmapped (which unlocks it) only once its last
//! secret has left, and only beyond a small reserve of empty pages; so dropping one key never
//! unlocks another, and a workload that opens and closes files makes no system call for its
//! keys once the pool has grown to its working size. Slots come from per-size free lists under
//! one mutex held for a few list operations.
//!
//! [`LockedBox`] puts a value into a slot and wipes the slot when the value is dropped. The
//! value must hold no pointer to memory of its own (a `Box`, a `Vec`): that memory would not
//! be locked. Each type boxed in cloakfs is checked for that where it is boxed.
//!
//! Building a value usually passes it through the stack before it reaches its slot, and some
//! cipher crates copy key material onto the stack while they work. [`scrubbed`] runs such work
//! in a frame of its own and then overwrites the stack that frame used; [`LockedBox::new`]
//! builds every value that way.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::mem::{align_of, size_of, MaybeUninit};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};
use zeroize::Zeroize;

/// Slot sizes are multiples of this, and slots are aligned to it.
const SLOT_ALIGN: usize = 64;
/// Largest slot: one page of the smallest page size Linux has.
const MAX_SLOT: usize = 4096;
/// Size classes: slot sizes `SLOT_ALIGN`, `2 * SLOT_ALIGN`, ... `MAX_SLOT`.
const CLASSES: usize = MAX_SLOT / SLOT_ALIGN;
/// Pages mapped (and locked) at once when the pool grows.
const REGION_PAGES: usize = 16;
/// Empty pages kept mapped and locked for reuse before any is given back.
const SPARE_PAGES: usize = 16;
/// Bytes of stack overwritten after work on key material: more than the deepest such work
/// uses (Argon2 about 11 KiB, keying AES-SIV about 5 KiB, with the crates of this build).
const SCRUB_BYTES: usize = 16 * 1024;

/// A value in locked memory, wiped when dropped. See the module documentation.
pub struct LockedBox<T> {
    ptr: NonNull<T>,
    _owns: PhantomData<T>,
}

// SAFETY: a LockedBox owns its value exclusively, like a Box.
unsafe impl<T: Send> Send for LockedBox<T> {}
// SAFETY: shared access only hands out `&T`, like a Box.
unsafe impl<T: Sync> Sync for LockedBox<T> {}

impl<T> LockedBox<T> {
    /// The slot size for a `T`; refuses (at compile time) a type too large or too aligned.
    const SLOT: usize = {
        assert!(size_of::<T>() <= MAX_SLOT, "too large for a locked slot");
        assert!(
            align_of::<T>() <= SLOT_ALIGN,
            "too aligned for a locked slot"
        );
        let size = if size_of::<T>() == 0 {
            1
        } else {
            size_of::<T>()
        };
        size.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
    };

    /// Builds the value with `make`, directly into a locked slot as far as the compiler
    /// allows, and scrubs the stack `make` used.
    pub fn new(make: impl FnOnce() -> T) -> Self {
        let slot = pool().alloc(Self::SLOT).cast::<T>();
        // Gives the slot back if `make` panics.
        struct Unwind(NonNull<u8>, usize);
        impl Drop for Unwind {
            fn drop(&mut self) {
                pool().free(self.0, self.1);
            }
        }
        let unwind = Unwind(slot.cast(), Self::SLOT);
        // SAFETY: the slot is fresh, owned by nobody else, and `Self::SLOT` bytes long and
        // `SLOT_ALIGN`-aligned, which `Self::SLOT` checked is enough for a `T`.
        scrubbed(|| unsafe { slot.as_ptr().write(make()) });
        std::mem::forget(unwind);
        Self {
            ptr: slot,
            _owns: PhantomData,
        }
    }
}

impl<const N: usize> LockedBox<[u8; N]> {
    /// `N` zero bytes, to be filled in place: free slots are always all zeros.
    pub fn zeroed() -> Self {
        let slot = pool().alloc(Self::SLOT).cast::<[u8; N]>();
        Self {
            ptr: slot,
            _owns: PhantomData,
        }
    }
}

impl<T> Deref for LockedBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot holds an initialized `T` from construction until drop.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for LockedBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> Drop for LockedBox<T> {
    fn drop(&mut self) {
        // SAFETY: the slot holds an initialized `T` that is dropped exactly once, here; after
        // that its bytes are plain memory of the slot, which `MaybeUninit<u8>` may view.
        unsafe {
            std::ptr::drop_in_place(self.ptr.as_ptr());
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<MaybeUninit<u8>>(), Self::SLOT)
                .zeroize();
        }
        pool().free(self.ptr.cast(), Self::SLOT);
    }
}

/// Runs `work` in a frame of its own, then overwrites the stack below the caller that `work`
/// may have used, so copies of key material it left there do not outlive it.
pub fn scrubbed<R>(work: impl FnOnce() -> R) -> R {
    let r = in_own_frame(work);
    scrub_stack();
    r
}

#[inline(never)]
fn in_own_frame<R>(work: impl FnOnce() -> R) -> R {
    work()
}

/// Overwrites `SCRUB_BYTES` of stack below the caller's frame (where the frames of the
/// functions it called lay).
#[inline(never)]
fn scrub_stack() {
    let mut stack = MaybeUninit::<[u8; SCRUB_BYTES]>::uninit();
    // SAFETY: writes zeros over a local array of exactly that size.
    unsafe { std::ptr::write_bytes(stack.as_mut_ptr(), 0, 1) };
    // The array is never read: make the compiler assume it is, so the writes stay.
    std::hint::black_box(&mut stack);
}

/// Locks every page of the pool again. Called in a child after fork(2), which does not
/// inherit memory locks.
pub fn relock_after_fork() {
    pool().relock();
}

/// How much of a pool is mapped and locked.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolUsage {
    pages: usize,
    locked_pages: usize,
    live_slots: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool::new());

fn pool() -> MutexGuard<'static, Pool> {
    // A panic under the lock cannot leave the lists half-updated in a way that matters more
    // than losing every key: keep going.
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// One mapped page of the pool.
struct Page {
    /// Size of the page's slots; 0 while the page is empty and unassigned.
    slot: usize,
    /// Indexes of its free slots.
    free: Vec<u16>,
    /// Slots in use.
    live: usize,
    /// Whether mlock succeeded on it.
    locked: bool,
}

struct Pool {
    pages: BTreeMap<usize, Page>,
    /// Per size class, the pages that have a free slot.
    partial: [Vec<usize>; CLASSES],
    /// Empty pages, unassigned, still mapped and locked.
    empty: Vec<usize>,
    warned: bool,
}

impl Pool {
    const fn new() -> Self {
        Self {
            pages: BTreeMap::new(),
            partial: [const { Vec::new() }; CLASSES],
            empty: Vec::new(),
            warned: false,
        }
    }

    fn page_size() -> usize {
        rustix::param::page_size()
    }

    fn alloc(&mut self, slot: usize) -> NonNull<u8> {
        debug_assert!(slot % SLOT_ALIGN == 0 && slot <= MAX_SLOT);
        let class = slot / SLOT_ALIGN - 1;
        let base = match self.partial[class].last() {
            Some(&base) => base,
            None => {
                let base = self.take_empty_page();
                let page = self.pages.get_mut(&base).expect("mapped page");
                let count = Self::page_size() / slot;
                page.slot = slot;
                page.free.extend((0..count as u16).rev());
                self.partial[class].push(base);
                base
            }
        };
        let page = self.pages.get_mut(&base).expect("mapped page");
        let index = page.free.pop().expect("a listed page has a free slot");
        page.live += 1;
        if page.free.is_empty() {
            self.partial[class].pop();
        }
        let addr = base + index as usize * slot;
        NonNull::new(addr as *mut u8).expect("mapped pages are not at address 0")
    }

    fn free(&mut self, ptr: NonNull<u8>, slot: usize) {
        let class = slot / SLOT_ALIGN - 1;
        let addr = ptr.as_ptr() as usize;
        let base = addr & !(Self::page_size() - 1);
        let page = self.pages.get_mut(&base).expect("slot of a mapped page");
        debug_assert_eq!(page.slot, slot);
        page.free.push(((addr - base) / slot) as u16);
        page.live -= 1;
        if page.free.len() == 1 {
            self.partial[class].push(base);
        }
        if page.live > 0 {
            return;
        }
        // Its last secret has left: the page is empty (every slot wiped on drop).
        let list = &mut self.partial[class];
        let at = list.iter().rposition(|&b| b == base).expect("listed");
        list.swap_remove(at);
        page.slot = 0;
        page.free.clear();
        self.empty.push(base);
        if self.empty.len() > SPARE_PAGES {
            let oldest = self.empty.remove(0);
            self.pages.remove(&oldest);
            // SAFETY: the page was mapped by `map_region` and holds no live slot.
            let _ = unsafe { rustix::mm::munmap(oldest as *mut _, Self::page_size()) };
        }
    }

    fn take_empty_page(&mut self) -> usize {
        if self.empty.is_empty() {
            self.map_region();
        }
        self.empty.pop().expect("a region was just mapped")
    }

    fn map_region(&mut self) {
        let page = Self::page_size();
        let len = page * REGION_PAGES;
        // SAFETY: a fresh private anonymous mapping, aliasing nothing.
        let mapped = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        };
        let Ok(base) = mapped else {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len, page).expect("page-sized layout"),
            );
        };
        // SAFETY: madvise and mlock on the region just mapped; they change only how it is
        // paged and dumped.
        let locked = unsafe {
            let _ = rustix::mm::madvise(base, len, rustix::mm::Advice::LinuxDontDump);
            rustix::mm::mlock(base, len)
        };
        let mut each = [locked.is_ok(); REGION_PAGES];
        if locked.is_err() {
            // Near RLIMIT_MEMLOCK some single pages may still fit.
            for (i, ok) in each.iter_mut().enumerate() {
                // SAFETY: as above, on one page of the region.
                *ok = unsafe { rustix::mm::mlock(base.byte_add(i * page), page).is_ok() };
            }
        }
        if let (Err(e), false) = (locked, self.warned) {
            self.warned = true;
            tracing::warn!(
                "could not lock key memory into RAM ({e}): keys beyond the limit may reach \
                 swap (raise RLIMIT_MEMLOCK, ulimit -l)"
            );
        }
        // Lowest address last, so it is taken first.
        for i in (0..REGION_PAGES).rev() {
            let addr = base as usize + i * page;
            self.pages.insert(
                addr,
                Page {
                    slot: 0,
                    free: Vec::new(),
                    live: 0,
                    locked: each[i],
                },
            );
            self.empty.push(addr);
        }
    }

    fn relock(&mut self) {
        let page = Self::page_size();
        let mut run: Option<(usize, usize)> = None;
        let mut runs = Vec::new();
        for &addr in self.pages.keys() {
            run = match run {
                Some((start, end)) if end == addr => Some((start, addr + page)),
                Some(r) => {
                    runs.push(r);
                    Some((addr, addr + page))
                }
                None => Some((addr, addr + page)),
            };
        }
        runs.extend(run);
        for (start, end) in runs {
            // SAFETY: every page in the run is mapped by this pool.
            let ok = unsafe { rustix::mm::mlock(start as *mut _, end - start).is_ok() };
            for (_, p) in self.pages.range_mut(start..end) {
                p.locked = ok;
            }
        }
    }

    #[cfg(test)]
    fn usage(&self) -> PoolUsage {
        PoolUsage {
            pages: self.pages.len(),
            locked_pages: self.pages.values().filter(|p| p.locked).count(),
            live_slots: self.pages.values().map(|p| p.live).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VMA of /proc/self/smaps holding `addr`: its VmFlags and its `Locked:` kB.
    fn vma_of(addr: usize) -> Option<(Vec<String>, u64)> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut locked_kb = 0;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if !inside {
                continue;
            }
            if let Some(v) = line.strip_prefix("Locked:") {
                locked_kb = v.trim().trim_end_matches(" kB").parse().unwrap();
            }
            if let Some(v) = line.strip_prefix("VmFlags:") {
                return Some((v.split_whitespace().map(String::from).collect(), locked_kb));
            }
        }
        None
    }

    fn assert_locked(addr: usize, what: &str) {
        let (flags, locked_kb) = vma_of(addr).unwrap_or_else(|| panic!("{what}: not mapped"));
        assert!(
            flags.iter().any(|f| f == "lo"),
            "{what}: not locked {flags:?}"
        );
        assert!(
            flags.iter().any(|f| f == "dd"),
            "{what}: dumpable {flags:?}"
        );
        assert!(locked_kb >= 4, "{what}: Locked: {locked_kb} kB");
    }

    #[test]
    fn a_page_stays_locked_until_its_last_slot_leaves_and_spares_are_bounded() {
        // A pool of its own, so other tests' keys do not share its pages.
        let mut pool = Pool::new();
        let page = Pool::page_size();
        let a = pool.alloc(64);
        let b = pool.alloc(64);
        let base = a.as_ptr() as usize & !(page - 1);
        assert_eq!(
            b.as_ptr() as usize & !(page - 1),
            base,
            "two slots, one page"
        );
        pool.free(a, 64);
        assert_locked(b.as_ptr() as usize, "the other slot after one was freed");
        pool.free(b, 64);
        assert_locked(base, "an empty spare page");
        assert_eq!(pool.usage().live_slots, 0);

        // Fill more pages than the spares and the first region hold, then empty them all:
        // exactly the spares stay mapped, and they stay locked.
        let per_page = page / 4096;
        let slots: Vec<_> = (0..(REGION_PAGES + 8) * per_page)
            .map(|_| pool.alloc(4096))
            .collect();
        assert_eq!(pool.usage().pages, 2 * REGION_PAGES);
        assert_eq!(pool.usage().locked_pages, 2 * REGION_PAGES);
        for p in slots {
            pool.free(p, 4096);
        }
        assert_eq!(pool.usage().pages, SPARE_PAGES);
        for &p in &pool.empty {
            assert_locked(p, "a spare page");
        }
        // Give the spares back, so the test leaves nothing mapped.
        for p in std::mem::take(&mut pool.empty) {
            // SAFETY: mapped by this pool, empty.
            unsafe { rustix::mm::munmap(p as *mut _, page).unwrap() };
        }
    }

    #[test]
    fn slots_of_different_sizes_use_different_pages_and_stay_aligned() {
        let mut pool = Pool::new();
        let page = Pool::page_size();
        let small = pool.alloc(64);
        let large = pool.alloc(576);
        let large2 = pool.alloc(576);
        let pg = |p: NonNull<u8>| p.as_ptr() as usize & !(page - 1);
        assert_ne!(pg(small), pg(large));
        assert_eq!(pg(large), pg(large2));
        for p in [small, large, large2] {
            assert_eq!(p.as_ptr() as usize % SLOT_ALIGN, 0);
        }
        assert_eq!(
            (large2.as_ptr() as usize).abs_diff(large.as_ptr() as usize),
            576
        );
        pool.free(small, 64);
        pool.free(large, 576);
        pool.free(large2, 576);
        for p in std::mem::take(&mut pool.empty) {
            // SAFETY: mapped by this pool, empty.
            unsafe { rustix::mm::munmap(p as *mut _, page).unwrap() };
        }
    }

    #[test]
    fn a_dropped_value_is_wiped_and_its_destructor_runs() {
        // A size no other type in this crate has, so no other test takes the slot meanwhile;
        // the Arc is there for its destructor.
        struct Tracked(#[allow(dead_code)] std::sync::Arc<()>, [u8; 3000]);
        let alive = std::sync::Arc::new(());
        let boxed = LockedBox::new(|| Tracked(alive.clone(), [0xa5; 3000]));
        assert_eq!(boxed.1, [0xa5; 3000]);
        let addr = (&boxed.1 as *const [u8; 3000]).cast::<u8>();
        assert_locked(addr as usize, "a boxed value");
        assert_eq!(std::sync::Arc::strong_count(&alive), 2);
        let slot = LockedBox::<Tracked>::SLOT;
        let start = boxed.ptr.as_ptr().cast::<u8>();
        drop(boxed);
        assert_eq!(std::sync::Arc::strong_count(&alive), 1, "destructor ran");
        // The page stays mapped (a spare or shared with other tests' slots): read it back.
        for i in 0..slot {
            // SAFETY: pool pages are never unmapped while within the spare reserve or shared;
            // a volatile read of a byte of a mapped page.
            let byte = unsafe { start.add(i).read_volatile() };
            assert_eq!(byte, 0, "byte {i} of the freed slot");
        }
    }

    #[test]
    fn zeroed_bytes_are_zero_and_locked() {
        let mut b = LockedBox::<[u8; 32]>::zeroed();
        assert_eq!(*b, [0u8; 32]);
        b[0] = 1;
        assert_locked(b.as_ptr() as usize, "zeroed bytes");
    }
}
