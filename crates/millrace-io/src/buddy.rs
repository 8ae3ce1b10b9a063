//! A buddy allocator over the pages of one pool slice: O(log n) to take or give back a block of
//! 2^k pages, no allocation after construction (the free lists are intrusive, threaded through
//! arrays sized once), and freed neighbours merge so large buffers stay available.
//!
//! Written here because the crates that offer a buddy allocator either allocate per operation
//! (BTreeSet-based free lists) or manage a global heap; a slice of a pre-registered region needs
//! neither.

const NIL: u32 = u32::MAX;
const USED: u8 = u8::MAX;

pub struct Buddy {
    pages: u32,
    max_order: u8,
    /// The order of the free block starting at this page, or USED.
    order: Vec<u8>,
    next: Vec<u32>,
    prev: Vec<u32>,
    heads: Vec<u32>,
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
        let from = (order..=self.max_order).find(|&o| self.heads[o as usize] != NIL)?;
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

    /// Gives back the block of 2^order pages at `p` (as `alloc` returned it).
    pub fn free(&mut self, mut p: u32, mut order: u8) {
        debug_assert_eq!(self.order[p as usize], USED, "double free of page {p}");
        self.free_pages += 1 << order;
        debug_assert!(self.free_pages <= self.pages);
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
}
