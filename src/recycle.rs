//! Buffers handed on from one chunk of work to the next.
//!
//! Freed blocks of over 1 MiB go back to the system (see `main`), so a large buffer allocated
//! for each chunk is fresh memory every time: a page fault every 4 KiB. The loops that would do
//! so take their buffers from a [`Recycled`] and give them back when done.

use std::sync::Mutex;

/// Values kept for reuse: as many as are in use at once, at most [`Recycled::KEPT`].
#[derive(Debug)]
pub struct Recycled<T>(Mutex<Vec<T>>);

impl<T: Default> Recycled<T> {
    /// Twice the chunks in flight on a machine of eight cores.
    const KEPT: usize = 32;

    pub const fn new() -> Self {
        Recycled(Mutex::new(Vec::new()))
    }

    /// A value given back before, or a new one.
    pub fn take(&self) -> T {
        self.0
            .lock()
            .ok()
            .and_then(|mut kept| kept.pop())
            .unwrap_or_default()
    }

    pub fn give(&self, value: T) {
        if let Ok(mut kept) = self.0.lock()
            && kept.len() < Self::KEPT
        {
            kept.push(value);
        }
    }
}

impl<T: Default> Default for Recycled<T> {
    fn default() -> Self {
        Recycled::new()
    }
}

impl<T: Copy + Default> Recycled<Vec<T>> {
    /// A buffer of `len` default values, in the room of one given back before if any.
    pub fn take_filled(&self, len: usize) -> Vec<T> {
        let mut buffer = self.take();
        buffer.clear();
        buffer.resize(len, T::default());
        buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_with_its_room() {
        let buffers: Recycled<Vec<u8>> = Recycled::new();
        let mut first = buffers.take_filled(1000);
        first[0] = 7;
        let room = first.capacity();
        buffers.give(first);
        let again = buffers.take_filled(10);
        assert_eq!(again, vec![0; 10]);
        assert_eq!(again.capacity(), room);
        assert!(buffers.take().is_empty(), "none left: a new one");
    }
}
