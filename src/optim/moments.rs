//! The per-parameter state of the Adam family ([`super::Adam`],
//! [`super::LazyAdam`]): a step count and the two moments, keyed by
//! parameter name, with its checkpoint form.

use std::collections::BTreeMap;

use ndarray::{ArrayD, IxDyn};

use super::{StateValue, split_entry, unknown_field, wrong_kind};
use crate::{Error, Parameter, Real, Result};

const FIELDS: [&str; 3] = ["exp_avg", "exp_avg_sq", "step"];

/// One parameter's Adam state.
#[derive(Clone, Debug)]
pub(super) struct Moments<T> {
    /// Steps taken (PyTorch's `state["step"]`).
    pub step: u64,
    /// First moment `m`, the parameter's shape, standard layout.
    pub exp_avg: ArrayD<T>,
    /// Second moment `v`, the parameter's shape, standard layout.
    pub exp_avg_sq: ArrayD<T>,
}

impl<T> Moments<T> {
    /// `m` and `v` as flat slices, for the update kernels.
    pub fn slices_mut(&mut self) -> (&mut [T], &mut [T]) {
        let m = self
            .exp_avg
            .as_slice_mut()
            .expect("state is standard layout");
        let v = self
            .exp_avg_sq
            .as_slice_mut()
            .expect("state is standard layout");
        (m, v)
    }
}

/// The Adam state of every parameter an optimiser has updated.
#[derive(Clone, Debug, Default)]
pub(super) struct MomentTable<T> {
    slots: BTreeMap<String, Moments<T>>,
}

impl<T: Real> MomentTable<T> {
    /// The state of `param`, zeros (step 0) the first time; an error if
    /// the kept state has another shape than the parameter.
    pub fn slot(&mut self, param: &Parameter<T>) -> Result<&mut Moments<T>> {
        let shape = param.value().shape();
        if let Some(m) = self.slots.get(param.name()) {
            if m.exp_avg.shape() != shape {
                return Err(state_shape_error(param, "exp_avg", m.exp_avg.shape()));
            }
        }
        Ok(self
            .slots
            .entry(param.name().to_string())
            .or_insert_with(|| Moments {
                step: 0,
                exp_avg: ArrayD::zeros(IxDyn(shape)),
                exp_avg_sq: ArrayD::zeros(IxDyn(shape)),
            }))
    }

    /// The state of the parameter with this name, if it has any.
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&Moments<T>> {
        self.slots.get(name)
    }

    /// `(name.exp_avg, m)`, `(name.exp_avg_sq, v)`, `(name.step, t)` per
    /// parameter, sorted by name.
    pub fn state(&self) -> Vec<(String, StateValue<T>)> {
        let mut out = Vec::with_capacity(3 * self.slots.len());
        for (name, m) in &self.slots {
            out.push((
                format!("{name}.exp_avg"),
                StateValue::Array(m.exp_avg.clone()),
            ));
            out.push((
                format!("{name}.exp_avg_sq"),
                StateValue::Array(m.exp_avg_sq.clone()),
            ));
            out.push((format!("{name}.step"), StateValue::Step(m.step)));
        }
        out
    }

    /// Replaces the table with the entries of [`MomentTable::state`]; on an
    /// error the table is unchanged.
    pub fn load(&mut self, entries: Vec<(String, StateValue<T>)>) -> Result<()> {
        type Partial<T> = (Option<ArrayD<T>>, Option<ArrayD<T>>, Option<u64>);
        let mut parts: BTreeMap<String, Partial<T>> = BTreeMap::new();
        for (entry, value) in entries {
            let (param, field) = split_entry(&entry)?;
            let slot = parts.entry(param.to_string()).or_default();
            let taken = match (field, value) {
                ("exp_avg", StateValue::Array(a)) => slot.0.replace(a).is_some(),
                ("exp_avg_sq", StateValue::Array(a)) => slot.1.replace(a).is_some(),
                ("step", StateValue::Step(s)) => slot.2.replace(s).is_some(),
                ("exp_avg" | "exp_avg_sq", v) => return Err(wrong_kind(&entry, "real array", &v)),
                ("step", v) => return Err(wrong_kind(&entry, "u64 step count", &v)),
                _ => return Err(unknown_field(&entry, &FIELDS)),
            };
            if taken {
                return Err(Error::format("optimiser state entry given twice").in_array(entry));
            }
        }
        let mut slots = BTreeMap::new();
        for (name, (m, v, step)) in parts {
            let missing = |field: &str| {
                Error::new(crate::ErrorKind::Missing).in_array(format!("{name}.{field}"))
            };
            let m = m.ok_or_else(|| missing("exp_avg"))?;
            let v = v.ok_or_else(|| missing("exp_avg_sq"))?;
            let step = step.ok_or_else(|| missing("step"))?;
            if v.shape() != m.shape() {
                return Err(Error::shape(
                    "optimiser state",
                    format!("{:?} (the shape of `{name}.exp_avg`)", m.shape()),
                    v.shape(),
                )
                .in_array(format!("{name}.exp_avg_sq")));
            }
            let exp_avg = m.as_standard_layout().into_owned();
            let exp_avg_sq = v.as_standard_layout().into_owned();
            slots.insert(
                name,
                Moments {
                    step,
                    exp_avg,
                    exp_avg_sq,
                },
            );
        }
        self.slots = slots;
        Ok(())
    }

    /// Every parameter with state is in `params`, with the state's shape.
    pub fn check(&self, params: &[&Parameter<T>]) -> Result<()> {
        for (name, m) in &self.slots {
            match params.iter().find(|p| p.name() == name) {
                None => {
                    return Err(Error::format(
                        "optimiser state for a parameter that is not being trained",
                    )
                    .in_array(format!("{name}.exp_avg")));
                }
                Some(p) if p.value().shape() != m.exp_avg.shape() => {
                    return Err(state_shape_error(p, "exp_avg", m.exp_avg.shape()));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// Kept state of `param` (field `field`) has shape `found`, not the
/// parameter's.
pub(super) fn state_shape_error<T>(param: &Parameter<T>, field: &str, found: &[usize]) -> Error {
    Error::shape(
        "optimiser state",
        format!(
            "{:?} (the shape of parameter `{}`)",
            param.value().shape(),
            param.name()
        ),
        found,
    )
    .in_array(format!("{}.{field}", param.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    type Entries = Vec<(String, StateValue<f32>)>;

    fn entries() -> Entries {
        vec![
            (
                "a.b.exp_avg".into(),
                StateValue::Array(array![1.0f32, 2.0].into_dyn()),
            ),
            (
                "a.b.exp_avg_sq".into(),
                StateValue::Array(array![3.0f32, 4.0].into_dyn()),
            ),
            ("a.b.step".into(), StateValue::Step((1 << 24) + 1)),
        ]
    }

    #[test]
    fn load_then_state_round_trips() {
        let mut t = MomentTable::<f32>::default();
        t.load(entries()).unwrap();
        assert_eq!(t.state(), entries());
        assert_eq!(t.get("a.b").unwrap().step, 16_777_217);
    }

    #[test]
    fn load_errors_name_the_entry_and_keep_the_table() {
        let mut t = MomentTable::<f32>::default();
        t.load(entries()).unwrap();
        let cases: Vec<(Entries, &str)> = vec![
            (
                vec![("a.b.exp_avg_sqr".into(), StateValue::Step(1))],
                "array `a.b.exp_avg_sqr`: unknown optimiser state field (this optimiser keeps exp_avg, exp_avg_sq, step)",
            ),
            (
                vec![(
                    "a.b.step".into(),
                    StateValue::Array(array![1.0f32].into_dyn()),
                )],
                "array `a.b.step`: has dtype real array, expected u64 step count",
            ),
            (entries()[..2].to_vec(), "array `a.b.step`: is missing"),
            (
                [entries(), entries()[2..].to_vec()].concat(),
                "array `a.b.step`: optimiser state entry given twice",
            ),
            (
                vec![
                    entries()[0].clone(),
                    (
                        "a.b.exp_avg_sq".into(),
                        StateValue::Array(array![3.0f32].into_dyn()),
                    ),
                    entries()[2].clone(),
                ],
                "array `a.b.exp_avg_sq`: optimiser state has shape [1], expected [2] (the shape of `a.b.exp_avg`)",
            ),
        ];
        for (bad, message) in cases {
            assert_eq!(t.load(bad).unwrap_err().to_string(), message);
            assert_eq!(t.state(), entries());
        }
    }

    #[test]
    fn check_finds_unknown_names_and_shape_mismatches() {
        let mut t = MomentTable::<f32>::default();
        t.load(entries()).unwrap();
        let right = Parameter::new("a.b", array![0.0f32, 0.0].into_dyn());
        let wrong = Parameter::new("a.b", array![0.0f32].into_dyn());
        let other = Parameter::new("c", array![0.0f32, 0.0].into_dyn());
        assert!(t.check(&[&other, &right]).is_ok());
        assert_eq!(
            t.check(&[&wrong]).unwrap_err().to_string(),
            "array `a.b.exp_avg`: optimiser state has shape [2], expected [1] (the shape of parameter `a.b`)"
        );
        assert_eq!(
            t.check(&[&other]).unwrap_err().to_string(),
            "array `a.b.exp_avg`: optimiser state for a parameter that is not being trained"
        );
        assert!(t.slot(&wrong).is_err());
        assert!(t.slot(&right).is_ok());
    }
}
