//! A buddy allocator over the pages of one pool slice: O(log n) to take or give back a block of
//! 2^k pages, no allocation after construction (the free lists are intrusive, threaded through
//! arrays sized once), and freed neighbours merge so large buffers stay available.
//!
//! Written here because the crates that offer a buddy allocator either allocate per operation
//! (BTreeSet-based free lists) or manage a global heap; a slice of a pre-registered region needs
//! neither.

const NIL: u32 = u32::MAX;
const USED: u8 = u8::MAX;

/// Orders whose freed blocks are kept whole for the next take of their size (4 KiB to
/// 128 KiB: the sizes of the requests that come and go most).
const KEPT_ORDERS: usize = 6;
/// Blocks kept per order. A 4 KiB block freed into a nearly empty slice merged with its buddies
/// up to the largest order and the next take split it all the way down again, about 26 list
/// operations on scattered pages per request (1-2% of a core at 4K on NVMe/TCP,
/// docs/PERFORMANCE.md); a kept block is one push and one pop.
const KEPT_DEPTH: usize = 256;

pub struct Buddy {
    pages: u32,
    max_order: u8,
    /// The order of the free block starting at this page, or USED.
    order: Vec<u8>,
    next: Vec<u32>,
    prev: Vec<u32>,
    heads: Vec<u32>,
    /// Free blocks of the small orders, not merged: still marked USED in `order`, so no buddy
    /// merges with them. Given to the buddy lists when a take finds no block otherwise.
    kept: [Vec<u32>; KEPT_ORDERS],
    /// Free pages, the kept blocks' included.
    free_pages: u32,
}

impl Buddy {
    /// Manages pages 0..pages; no block is larger than 2^max_order pages.
    pub fn new(pages: u32, max_order: u8) -> Buddy {
        let n = pages as usize;
        let mut b = Buddy {
            pages,
            max_order,
            order: vec![USED; n],
            next: vec![NIL; n],
            prev: vec![NIL; n],
            heads: vec![NIL; max_order as usize + 1],
            kept: std::array::from_fn(|_| Vec::with_capacity(KEPT_DEPTH)),
            free_pages: 0,
        };
        // Carve the pages into the largest naturally aligned blocks that fit.
        let mut p = 0u32;
        while p < pages {
            let mut o = max_order;
            while o > 0 && (!p.is_multiple_of(1 << o) || p + (1 << o) > pages) {
                o -= 1;
            }
            b.push(p, o);
            b.free_pages += 1 << o;
            p += 1 << o;
        }
        b
    }

    pub fn free_pages(&self) -> u32 {
        self.free_pages
    }

    fn push(&mut self, p: u32, o: u8) {
        let h = self.heads[o as usize];
        self.next[p as usize] = h;
        self.prev[p as usize] = NIL;
        if h != NIL {
            self.prev[h as usize] = p;
        }
        self.heads[o as usize] = p;
        self.order[p as usize] = o;
    }

    fn unlink(&mut self, p: u32) {
        let o = self.order[p as usize];
        let (n, pr) = (self.next[p as usize], self.prev[p as usize]);
        if pr != NIL {
            self.next[pr as usize] = n;
        } else {
            self.heads[o as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = pr;
        }
        self.order[p as usize] = USED;
    }

    /// Takes a block of 2^order pages; returns its first page.
    pub fn alloc(&mut self, order: u8) -> Option<u32> {
        if let Some(p) = self.kept.get_mut(order as usize).and_then(Vec::pop) {
            self.free_pages -= 1 << order;
            return Some(p);
        }
        let from = match self.smallest_list(order) {
            Some(o) => o,
            None => {
                // Kept blocks may merge into the block asked for.
                self.merge_kept();
                self.smallest_list(order)?
            }
        };
        let p = self.heads[from as usize];
        self.unlink(p);
        let mut o = from;
        while o > order {
            o -= 1;
            self.push(p + (1 << o), o);
        }
        self.free_pages -= 1 << order;
        Some(p)
    }

    /// The smallest order from `order` up whose free list has a block.
    fn smallest_list(&self, order: u8) -> Option<u8> {
        (order..=self.max_order).find(|&o| self.heads[o as usize] != NIL)
    }

    /// Gives back the block of 2^order pages at `p` (as `alloc` returned it).
    pub fn free(&mut self, p: u32, order: u8) {
        debug_assert_eq!(self.order[p as usize], USED, "double free of page {p}");
        debug_assert!(
            self.kept.iter().all(|k| !k.contains(&p)),
            "double free of page {p}"
        );
        self.free_pages += 1 << order;
        debug_assert!(self.free_pages <= self.pages);
        match self.kept.get_mut(order as usize) {
            Some(k) if k.len() < KEPT_DEPTH => k.push(p),
            _ => self.merge_in(p, order),
        }
    }

    /// Gives every kept block to the buddy lists, merging it with its free neighbours.
    fn merge_kept(&mut self) {
        for o in 0..KEPT_ORDERS {
            while let Some(p) = self.kept[o].pop() {
                self.merge_in(p, o as u8);
            }
        }
    }

    /// Puts a free block (already counted in `free_pages`) on the buddy lists, merged with its
    /// buddies as far as they are free.
    fn merge_in(&mut self, mut p: u32, mut order: u8) {
        while order < self.max_order {
            let buddy = p ^ (1 << order);
            if buddy >= self.pages || self.order[buddy as usize] != order {
                break;
            }
            self.unlink(buddy);
            p = p.min(buddy);
            order += 1;
        }
        self.push(p, order);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_merges_back_to_whole() {
        let mut b = Buddy::new(16, 3);
        assert_eq!(b.free_pages(), 16);
        let a = b.alloc(0).unwrap();
        let c = b.alloc(2).unwrap();
        let d = b.alloc(3).unwrap();
        assert_eq!(b.free_pages(), 16 - 1 - 4 - 8);
        assert!(b.alloc(3).is_none(), "no 8-page block is left");
        b.free(a, 0);
        b.free(c, 2);
        b.free(d, 3);
        assert_eq!(b.free_pages(), 16);
        // Merged again: both 8-page blocks are whole.
        assert!(b.alloc(3).is_some());
        assert!(b.alloc(3).is_some());
        assert!(b.alloc(0).is_none());
        // A size that is not a power of two: blocks of 8 and 4 pages.
        let mut b = Buddy::new(12, 3);
        assert!(b.alloc(3).is_some());
        assert!(b.alloc(2).is_some());
        assert!(b.alloc(0).is_none());
    }

    #[test]
    fn random_alloc_free_never_overlaps() {
        let mut b = Buddy::new(64, 4);
        let mut owner = [usize::MAX; 64];
        let mut held: Vec<(u32, u8)> = Vec::new();
        let mut x = 12345u64;
        for i in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if x >> 63 == 0 || held.is_empty() {
                let o = ((x >> 33) % 5) as u8;
                if let Some(p) = b.alloc(o) {
                    for q in p..p + (1 << o) {
                        assert_eq!(owner[q as usize], usize::MAX, "page {q} handed out twice");
                        owner[q as usize] = i;
                    }
                    held.push((p, o));
                }
            } else {
                let (p, o) = held.swap_remove((x >> 20) as usize % held.len());
                for q in p..p + (1 << o) {
                    owner[q as usize] = usize::MAX;
                }
                b.free(p, o);
            }
        }
        for (p, o) in held.drain(..) {
            b.free(p, o);
        }
        assert_eq!(b.free_pages(), 64);
        assert!(b.alloc(4).is_some());
    }

    #[test]
    fn kept_small_blocks_still_merge_for_a_large_take() {
        // Every page freed as a single page, the first KEPT_DEPTH of them kept unmerged: the
        // slice must still give its largest blocks.
        let pages = 2 * KEPT_DEPTH as u32;
        let mut b = Buddy::new(pages, 9);
        let all: Vec<u32> = (0..pages).map(|_| b.alloc(0).unwrap()).collect();
        assert!(b.alloc(0).is_none());
        for p in all {
            b.free(p, 0);
        }
        assert_eq!(b.free_pages(), pages);
        assert_eq!(
            b.alloc(9),
            Some(0),
            "the kept pages merged back into one block"
        );
        assert!(b.alloc(0).is_none());
        b.free(0, 9);
        // A kept block is handed out again before the lists are split.
        let p = b.alloc(1).unwrap();
        b.free(p, 1);
        assert_eq!(b.alloc(1), Some(p));
    }
}
