/// A majority of `configured` masters.
pub fn quorum_of(configured: usize) -> usize {
    configured / 2 + 1
}

/// Counts votes as they arrive and says when the outcome can no longer change.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tally {
    configured: usize,
    quorum: usize,
    yes: usize,
    no: usize,
}

impl Tally {
    pub(crate) fn new(configured: usize) -> Self {
        Self {
            configured,
            quorum: quorum_of(configured),
            yes: 0,
            no: 0,
        }
    }

    pub(crate) fn record(&mut self, vote: bool) {
        if vote {
            self.yes += 1;
        } else {
            self.no += 1;
        }
    }

    /// `Some(true)` once a majority voted yes, `Some(false)` once too few masters are left to reach one.
    pub(crate) fn decided(&self) -> Option<bool> {
        if self.yes >= self.quorum {
            Some(true)
        } else if self.configured - self.no.min(self.configured) < self.quorum {
            Some(false)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majorities() {
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(quorum_of), [1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn decides_as_soon_as_the_outcome_is_fixed() {
        let mut tally = Tally::new(5);
        tally.record(true);
        tally.record(false);
        tally.record(true);
        assert_eq!(tally.decided(), None);
        tally.record(true);
        assert_eq!(tally.decided(), Some(true));

        let mut tally = Tally::new(5);
        tally.record(false);
        tally.record(true);
        tally.record(false);
        assert_eq!(tally.decided(), None);
        tally.record(false);
        assert_eq!(
            tally.decided(),
            Some(false),
            "3 of 5 refused: no majority is possible"
        );
    }
}
