//! A tensor's dimensions, kept small: a header of a million entries keeps a million shapes.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A tensor's dimensions. Up to four dimensions that each fit in 32 bits (those of every real
/// tensor) are held in place, in 24 bytes; other shapes behind a pointer, in memory their header
/// text already outweighs (a dimension past 32 bits takes ten digits to write).
#[derive(Clone)]
pub struct Shape(Dims);

#[derive(Clone)]
enum Dims {
    Small { rank: u8, dims: [u32; SMALL_RANK] },
    Large(Arc<[u64]>),
}

const SMALL_RANK: usize = 4;

impl Shape {
    pub fn from_slice(dims: &[u64]) -> Shape {
        let mut small = [0u32; SMALL_RANK];
        let fits = dims.len() <= SMALL_RANK
            && dims
                .iter()
                .zip(&mut small)
                .all(|(&dim, slot)| u32::try_from(dim).map(|dim| *slot = dim).is_ok());
        match u8::try_from(dims.len()) {
            Ok(rank) if fits => Shape(Dims::Small { rank, dims: small }),
            _ => Shape(Dims::Large(dims.into())),
        }
    }

    /// The number of dimensions.
    pub fn len(&self) -> usize {
        match &self.0 {
            Dims::Small { rank, .. } => usize::from(*rank),
            Dims::Large(dims) => dims.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The size along `axis`, `None` past the last axis.
    pub fn get(&self, axis: usize) -> Option<u64> {
        match &self.0 {
            Dims::Small { rank, dims } => dims[..usize::from(*rank)].get(axis).map(|&d| d.into()),
            Dims::Large(dims) => dims.get(axis).copied(),
        }
    }

    /// The dimensions, outermost first.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            shape: self,
            axes: 0..self.len(),
        }
    }

    /// Rows and columns, for a two-dimensional shape.
    pub fn matrix(&self) -> Option<[u64; 2]> {
        (self.len() == 2).then(|| [self.get(0), self.get(1)].map(Option::unwrap_or_default))
    }

    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

/// The dimensions of a [`Shape`], outermost first.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    shape: &'a Shape,
    axes: std::ops::Range<usize>,
}

impl Iterator for Iter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        self.axes.next().and_then(|axis| self.shape.get(axis))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.axes.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<u64> {
        self.axes.next_back().and_then(|axis| self.shape.get(axis))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Shape {
    type Item = u64;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl Default for Shape {
    fn default() -> Shape {
        Shape(Dims::Small {
            rank: 0,
            dims: [0; SMALL_RANK],
        })
    }
}

impl From<&[u64]> for Shape {
    fn from(dims: &[u64]) -> Shape {
        Shape::from_slice(dims)
    }
}

impl<const N: usize> From<[u64; N]> for Shape {
    fn from(dims: [u64; N]) -> Shape {
        Shape::from_slice(&dims)
    }
}

impl PartialEq for Shape {
    fn eq(&self, other: &Shape) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Shape {}

/// Dimension by dimension, as slices compare.
impl Ord for Shape {
    fn cmp(&self, other: &Shape) -> std::cmp::Ordering {
        self.iter().cmp(other.iter())
    }
}

impl PartialOrd for Shape {
    fn partial_cmp(&self, other: &Shape) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for Shape {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_usize(self.len());
        for dim in self {
            state.write_u64(dim);
        }
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Shape {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn is_small() {
        assert_eq!(std::mem::size_of::<Shape>(), 24);
        // What an entry of a header costs, against the 51 bytes of the shortest entry's text.
        assert_eq!(std::mem::size_of::<crate::format::Tensor>(), 88);
    }

    proptest! {
        #[test]
        fn holds_any_dimensions(dims in prop::collection::vec(
            prop_oneof![0..4u64, any::<u32>().prop_map(u64::from), any::<u64>()],
            0..7,
        )) {
            let shape = Shape::from_slice(&dims);
            prop_assert_eq!(shape.len(), dims.len());
            prop_assert_eq!(shape.to_vec(), dims.clone());
            prop_assert_eq!(shape.get(dims.len()), None);
            prop_assert_eq!(&shape, &Shape::from_slice(&dims));
            prop_assert_eq!(shape.iter().rev().collect::<Vec<_>>(), dims.iter().rev().copied().collect::<Vec<_>>());
            let other = Shape::from_slice(&dims[..dims.len() / 2]);
            prop_assert_eq!(shape.cmp(&other), dims.as_slice().cmp(&dims[..dims.len() / 2]));
            let small = dims.len() <= SMALL_RANK && dims.iter().all(|&d| u32::try_from(d).is_ok());
            prop_assert_eq!(matches!(shape.0, Dims::Small { .. }), small);
        }
    }
}
