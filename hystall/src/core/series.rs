//! Per-bucket figures of one flow or connection over a capture, stored from its
//! first busy bucket only: most flows of a long capture live for seconds, so a
//! dense vector from the capture's start would cost memory for nothing.

use serde::Serialize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Series<T> {
    /// Absolute index of `v[0]`.
    first: usize,
    v: Vec<T>,
}

impl<T: Copy + Default> Series<T> {
    /// The entry of absolute bucket `i`, created (with any gap before it) when
    /// missing; a bucket before the first one grows the series backwards.
    pub fn at(&mut self, i: usize) -> &mut T {
        if self.v.is_empty() {
            self.first = i;
        } else if i < self.first {
            let mut front = vec![T::default(); self.first - i];
            front.append(&mut self.v);
            self.v = front;
            self.first = i;
        }
        let rel = i - self.first;
        if self.v.len() <= rel {
            self.v.resize(rel + 1, T::default());
        }
        &mut self.v[rel]
    }

    /// Buckets `at(i)` would add (callers with a budget check it first).
    pub fn growth(&self, i: usize) -> usize {
        if self.v.is_empty() {
            1
        } else if i >= self.end() {
            i + 1 - self.end()
        } else {
            self.first.saturating_sub(i)
        }
    }

    /// The entry of absolute bucket `i` (default outside the series).
    pub fn get(&self, i: usize) -> T {
        i.checked_sub(self.first).and_then(|r| self.v.get(r)).copied().unwrap_or_default()
    }

    /// One past the last absolute bucket.
    pub fn end(&self) -> usize {
        if self.v.is_empty() { 0 } else { self.first + self.v.len() }
    }

    /// The first absolute bucket (0 when empty).
    pub fn start(&self) -> usize {
        self.first
    }

    /// Buckets stored.
    pub fn stored(&self) -> usize {
        self.v.len()
    }

    /// (absolute index, entry) of every stored bucket.
    pub fn iter(&self) -> impl Iterator<Item = (usize, T)> + '_ {
        self.v.iter().enumerate().map(|(r, t)| (self.first + r, *t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_only_from_the_first_bucket_and_grows_both_ways() {
        let mut s: Series<[u32; 2]> = Series::default();
        assert_eq!((s.end(), s.get(5)), (0, [0, 0]));
        s.at(1000)[0] += 3;
        s.at(1002)[1] += 4;
        assert_eq!((s.start(), s.end(), s.stored()), (1000, 1003, 3));
        s.at(998)[0] += 1;
        assert_eq!((s.start(), s.get(998), s.get(1000), s.get(1002)), (998, [1, 0], [3, 0], [0, 4]));
        assert_eq!(s.iter().filter(|(_, v)| *v != [0, 0]).count(), 3);
    }
}
