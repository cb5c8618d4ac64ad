//! The flow tables of TCP and UDP: flows in slots (a flow's mio token is
//! derived from its slot, so slots are reused, never shifted) and an index
//! by the flow's key.
use std::collections::HashMap;
use std::hash::Hash;

/// A flow that knows its own key.
pub trait Keyed {
    type Key: Copy + Eq + Hash;
    fn key(&self) -> Self::Key;
}

pub struct Slots<F: Keyed> {
    slots: Vec<Option<F>>,
    free: Vec<usize>,
    by_key: HashMap<F::Key, usize>,
}

impl<F: Keyed> Default for Slots<F> {
    fn default() -> Self {
        Slots { slots: Vec::new(), free: Vec::new(), by_key: HashMap::new() }
    }
}

impl<F: Keyed> Slots<F> {
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn find(&self, key: &F::Key) -> Option<usize> {
        self.by_key.get(key).copied()
    }

    pub fn get(&self, slot: usize) -> Option<&F> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut F> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// The slot the next insert will take.
    pub fn next_slot(&self) -> usize {
        self.free.last().copied().unwrap_or(self.slots.len())
    }

    pub fn insert(&mut self, flow: F) -> usize {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.by_key.insert(flow.key(), slot);
        self.slots[slot] = Some(flow);
        slot
    }

    pub fn remove(&mut self, slot: usize) -> Option<F> {
        let flow = self.slots.get_mut(slot)?.take()?;
        self.by_key.remove(&flow.key());
        self.free.push(slot);
        Some(flow)
    }

    /// Every slot index, used or free.
    pub fn slots(&self) -> std::ops::Range<usize> {
        0..self.slots.len()
    }

    /// Slots of the flows `pred` picks.
    pub fn select(&self, pred: impl Fn(&F) -> bool) -> Vec<usize> {
        self.slots.iter().enumerate().filter_map(|(i, f)| f.as_ref().filter(|f| pred(f)).map(|_| i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct F(u8);
    impl Keyed for F {
        type Key = u8;
        fn key(&self) -> u8 {
            self.0
        }
    }

    #[test]
    fn slots_are_reused_and_indexed_by_key() {
        let mut s = Slots::<F>::default();
        assert_eq!(s.next_slot(), 0);
        let a = s.insert(F(7));
        let b = s.insert(F(9));
        assert_eq!((a, b, s.len()), (0, 1, 2));
        assert_eq!(s.find(&9), Some(1));
        assert_eq!(s.remove(a).map(|f| f.0), Some(7));
        assert_eq!(s.find(&7), None);
        assert!(s.remove(a).is_none(), "a free slot holds nothing");
        assert_eq!(s.next_slot(), 0, "the freed slot is taken next");
        assert_eq!(s.insert(F(3)), 0);
        assert_eq!(s.select(|f| f.0 > 5), vec![1]);
        assert_eq!(s.slots(), 0..2);
    }
}
