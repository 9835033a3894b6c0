//! The decision rule: which split rows are kept (see the module docs of
//! [`super`]).

use super::RowEval;

/// The decision rule: which split rows are kept (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// The family-wise error rate over all rows (default 0.05).
    pub alpha: f64,
    /// A row seen fewer times than this on held-out text is not kept
    /// (default 5: a standard error of fewer tokens is not worth trusting).
    pub min_count: usize,
    /// The saving per token (nats) a row must exceed (default 0.25: it
    /// must cut the perplexity of its contexts by a fifth).
    pub margin: f64,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            alpha: 0.05,
            min_count: 5,
            margin: 0.25,
        }
    }
}

impl Rule {
    /// The rule in words, for reports.
    pub const DESCRIPTION: &str = "a row is kept when its held-out tokens do not follow the shared row's distribution (their total saving exceeds its expectation under that distribution by more than Bennett's bound at the family-wise level alpha, Bonferroni over all rows: heldout_evidence > 1), it saves more than margin nats a token, and it was seen at least min_count times on held-out text";

    /// The radius r of Bennett's bound for a row: the excess of its
    /// tokens' total saving over the null mean that chance reaches with
    /// probability at most α / n_rows. With `v = n·σ₀²`, b the range and
    /// `L = ln(n_rows / α)`, Bennett's inequality
    /// `P(S − n·μ₀ ≥ r) ≤ exp(−(v/b²)·h(b·r/v))`, `h(u) = (1 + u)·ln(1 + u) − u`,
    /// gives `r = (v/b)·h⁻¹(L·b²/v)`; it is never looser than Bernstein's.
    pub fn radius(&self, n_rows: usize, row: &RowEval) -> f64 {
        let l = (n_rows.max(1) as f64 / self.alpha).ln();
        let v = row.n_tokens as f64 * row.null_var;
        let b = row.null_range;
        if b <= 0.0 || v <= 0.0 {
            // A degenerate null: every token saves the same (its mean), so
            // any excess at all is evidence.
            return 0.0;
        }
        let target = l * b * b / v;
        let h = |u: f64| (1.0 + u) * u.ln_1p() - u;
        // h is increasing on u ≥ 0: bisect for h(u) = target.
        let (mut lo, mut hi) = (0.0, 1.0);
        while h(hi) < target {
            hi *= 2.0;
        }
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if h(mid) < target {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi - lo <= 1e-12 * hi {
                break;
            }
        }
        (v / b) * hi
    }

    /// Each row's evidence against the shared distribution: its total
    /// saving's excess over the null mean, in units of the radius (> 1:
    /// significant at the family-wise level α).
    pub fn evidence(&self, rows: &[RowEval]) -> Vec<f64> {
        rows.iter()
            .map(|r| {
                let excess = r.gain - r.n_tokens as f64 * r.null_mean;
                let radius = self.radius(rows.len(), r);
                if radius > 0.0 {
                    excess / radius
                } else if excess > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Which rows are kept: seen at least `min_count` times, significant
    /// (evidence above 1), and saving more than `margin` nats a token.
    pub fn keep(&self, rows: &[RowEval]) -> Vec<bool> {
        rows.iter()
            .zip(self.evidence(rows))
            .map(|(r, e)| r.n_tokens >= self.min_count && e > 1.0 && r.gain_per_token > self.margin)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_keeps_what_saves_beyond_noise_and_by_a_margin() {
        // (tokens, total saving, null mean, null variance, null range).
        let row = |n: usize, gain: f64, mean: f64, var: f64, range: f64| RowEval {
            n_tokens: n,
            gain,
            gain_per_token: gain / n as f64,
            gain_se: 0.0,
            null_mean: mean,
            null_var: var,
            null_range: range,
        };
        let rows = [
            // Twelve tokens that follow the row's own distribution.
            row(12, 68.0, -5.0, 4.0, 11.0),
            // Noise: a saving within what the shared distribution gives.
            row(40, 2.0, -0.01, 0.04, 0.5),
            // Too few tokens.
            row(3, 30.0, -5.0, 4.0, 11.0),
            // Significant, but a few hundredths of a nat a token.
            row(10_000, 300.0, -0.001, 0.002, 0.2),
            // Seven tokens that agree exactly: no sample variance, yet well
            // within the null.
            row(7, 1.04, -0.005, 0.03, 0.4),
        ];
        assert_eq!(
            Rule::default().keep(&rows),
            [true, false, false, false, false]
        );
        let e = Rule::default().evidence(&rows);
        assert!(e[3] > 1.0, "the large row is significant: {}", e[3]);
    }
}
