//! A structured-output request's grammar as the scheduler sees it
//! (docs/scheduling.md §4.10): the request waits, skipped by every waiting
//! pass, until its grammar has compiled, and the news counts only when a
//! pass reaches the request (vLLM reads the compile result at that point).
//! Once released, the request schedules like any other; the caller checks
//! its sampled tokens against the grammar.

/// Where the grammar is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Grammar {
    /// Compiling, as far as the caller has said: the request is held.
    Compiling,
    /// Compiled; released when a waiting pass next reaches the request.
    Compiled,
    /// Failed to compile; reported each time a waiting pass reaches the
    /// request, which stays held until the caller ends it.
    Failed,
    /// Released: the request is scheduled as any other.
    Active,
}

/// What a waiting pass does with a request it reaches.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Reached {
    /// Skip it, as one whose grammar is not ready.
    Held,
    /// Skip it and report the failed compile.
    Failed,
    /// Admit it as usual; `released` says whether this pass released it.
    Go { released: bool },
}

impl Grammar {
    /// The caller's news of the compile; refused once the request is
    /// released (its grammar is in use).
    pub fn report(&mut self, compiled: bool) -> Result<(), &'static str> {
        if *self == Grammar::Active {
            return Err("its grammar is already in use");
        }
        *self = if compiled {
            Grammar::Compiled
        } else {
            Grammar::Failed
        };
        Ok(())
    }

    /// A waiting pass reached the request: release it if compiled.
    pub fn reach(&mut self) -> Reached {
        match *self {
            Grammar::Compiling => Reached::Held,
            Grammar::Failed => Reached::Failed,
            Grammar::Compiled => {
                *self = Grammar::Active;
                Reached::Go { released: true }
            }
            Grammar::Active => Reached::Go { released: false },
        }
    }

    /// Whether a waiting pass would skip the request.
    pub fn holds(self) -> bool {
        self != Grammar::Active
    }

    /// The state's name, as the twin spells it.
    pub fn name(self) -> &'static str {
        match self {
            Grammar::Compiling => "COMPILING",
            Grammar::Compiled => "COMPILED",
            Grammar::Failed => "FAILED",
            Grammar::Active => "ACTIVE",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_only_when_reached_after_compiling() {
        let mut g = Grammar::Compiling;
        assert_eq!(g.reach(), Reached::Held);
        g.report(true).unwrap();
        assert!(g.holds()); // compiled, but no pass has seen it yet
        assert_eq!(g.reach(), Reached::Go { released: true });
        assert_eq!(g.reach(), Reached::Go { released: false });
        assert!(g.report(false).is_err());
        assert_eq!(g, Grammar::Active);
    }

    #[test]
    fn a_failed_compile_is_reported_each_time_it_is_reached() {
        let mut g = Grammar::Compiling;
        g.report(false).unwrap();
        assert_eq!(g.reach(), Reached::Failed);
        assert_eq!(g.reach(), Reached::Failed);
        assert!(g.holds());
    }
}
