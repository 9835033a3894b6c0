//! Named parameter groups: each parameter goes to the optimiser of the
//! first group whose rule matches its name.

use super::{Optimizer, StateValue, split_entry};
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::param::{ParamGrad, Parameter};

/// A rule that claims a parameter by its name.
type Rule = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// Optimisers for named groups of parameters, as PyTorch's parameter
/// groups are: each parameter is updated by the optimiser of the first
/// group whose rule matches its name, never by its position in a list.
/// The state of group `g` is saved under `g.<param name>.<field>`.
///
/// ```
/// use ndarray::array;
/// use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, ParamGroups};
/// use splitgrad::{ParamGrad, Parameter};
/// # fn main() -> splitgrad::Result<()> {
/// let mut opt = ParamGroups::<f64>::new()
///     .group("tables", |name| name.starts_with("token_embedding."), LazyAdam::new(LazyAdamConfig::default())?)
///     .group("dense", |_| true, Adam::new(AdamConfig::default())?);
/// let mut table = Parameter::new("token_embedding.vocab.weight", array![[1.0, 2.0]].into_dyn());
/// let mut head = Parameter::new("lm_head.vocab.weight", array![[1.0, 2.0]].into_dyn());
/// opt.update(&mut table, &ParamGrad::Dense(array![[0.5, 0.5]].into_dyn()))?;
/// opt.update(&mut head, &ParamGrad::Dense(array![[0.5, 0.5]].into_dyn()))?;
/// let names: Vec<String> = opt.state().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names[0], "tables.token_embedding.vocab.weight.exp_avg");
/// assert_eq!(names[3], "dense.lm_head.vocab.weight.exp_avg");
/// # Ok(()) }
/// ```
pub struct ParamGroups<T: Real> {
    groups: Vec<(String, Rule, Box<dyn Optimizer<T> + Send>)>,
}

impl<T: Real> Default for ParamGroups<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Real> std::fmt::Debug for ParamGroups<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.groups.iter().map(|(n, _, _)| n.as_str()).collect();
        f.debug_struct("ParamGroups")
            .field("groups", &names)
            .finish()
    }
}

impl<T: Real> ParamGroups<T> {
    /// No group yet.
    pub fn new() -> Self {
        ParamGroups { groups: Vec::new() }
    }

    /// Adds a group named `name` (no dot), updated by `optimizer`, claiming
    /// the parameters whose names `rule` accepts and no earlier group
    /// claimed.
    ///
    /// **Panics** if the name is empty, has a dot, or is already a group's.
    #[track_caller]
    pub fn group(
        mut self,
        name: &str,
        rule: impl Fn(&str) -> bool + Send + Sync + 'static,
        optimizer: impl Optimizer<T> + Send + 'static,
    ) -> Self {
        assert!(
            !name.is_empty() && !name.contains('.'),
            "ParamGroups: a group name is not empty and has no dot, got {name:?}"
        );
        assert!(
            self.groups.iter().all(|(n, _, _)| n != name),
            "ParamGroups: group `{name}` is given twice"
        );
        self.groups
            .push((name.to_string(), Box::new(rule), Box::new(optimizer)));
        self
    }

    /// The group that claims a parameter of this name, if any.
    pub fn group_of(&self, param: &str) -> Option<&str> {
        self.groups
            .iter()
            .find(|(_, rule, _)| rule(param))
            .map(|(n, _, _)| n.as_str())
    }

    fn find(&mut self, param: &str) -> Result<&mut Box<dyn Optimizer<T> + Send>> {
        let names: Vec<&str> = self.groups.iter().map(|(n, _, _)| n.as_str()).collect();
        let list = names.join(", ");
        match self.groups.iter_mut().find(|(_, rule, _)| rule(param)) {
            Some((_, _, opt)) => Ok(opt),
            None => Err(Error::config(format!(
                "parameter `{param}` belongs to no optimiser group (groups: {list})"
            ))),
        }
    }
}

impl<T: Real> Optimizer<T> for ParamGroups<T> {
    /// Updates `param` with its group's optimiser; a parameter no group
    /// claims is an error.
    fn update(&mut self, param: &mut Parameter<T>, grad: &ParamGrad<T>) -> Result<()> {
        self.find(param.name())?.update(param, grad)
    }

    /// Every group's state, each entry prefixed with `<group>.`.
    fn state(&self) -> Vec<(String, StateValue<T>)> {
        let mut out = Vec::new();
        for (name, _, opt) in &self.groups {
            out.extend(
                opt.state()
                    .into_iter()
                    .map(|(k, v)| (format!("{name}.{k}"), v)),
            );
        }
        out
    }

    /// Every group's lent state, prefixed as [`Optimizer::state`]; `None`
    /// if a group cannot lend its own.
    fn state_refs(&self) -> Option<Vec<(String, super::StateRef<'_, T>)>> {
        let mut out = Vec::new();
        for (name, _, opt) in &self.groups {
            out.extend(
                opt.state_refs()?
                    .into_iter()
                    .map(|(k, v)| (format!("{name}.{k}"), v)),
            );
        }
        Some(out)
    }

    /// Gives each group the entries under `<group>.`; an entry of no group,
    /// or of a parameter the group's rule does not claim, is an error.
    fn load_state(&mut self, entries: Vec<(String, StateValue<T>)>) -> Result<()> {
        let mut per: Vec<Vec<(String, StateValue<T>)>> =
            self.groups.iter().map(|_| Vec::new()).collect();
        for (entry, value) in entries {
            let Some((group, rest)) = entry.split_once('.') else {
                return Err(Error::format("optimiser state entry names no group").in_array(entry));
            };
            let Some(k) = self.groups.iter().position(|(n, _, _)| n == group) else {
                let names: Vec<&str> = self.groups.iter().map(|(n, _, _)| n.as_str()).collect();
                return Err(Error::format(format!(
                    "optimiser state of an unknown group `{group}` (groups: {})",
                    names.join(", ")
                ))
                .in_array(entry));
            };
            let (param, _) = split_entry(rest).map_err(|e| e.in_array(entry.clone()))?;
            if self.group_of(param) != Some(group) {
                return Err(Error::format(format!(
                    "state of parameter `{param}` under group `{group}`, which does not claim it"
                ))
                .in_array(entry));
            }
            per[k].push((rest.to_string(), value));
        }
        let before = self.state();
        for (k, entries) in per.into_iter().enumerate() {
            let name = self.groups[k].0.clone();
            if let Err(e) = self.groups[k].2.load_state(entries) {
                // Put every group back as it was.
                let _ = self.load_state_unchecked(before);
                return Err(e.prefix_array(&format!("{name}.")));
            }
        }
        Ok(())
    }

    fn check_state(&self, params: &[&Parameter<T>]) -> Result<()> {
        for (name, _, opt) in &self.groups {
            let mine: Vec<&Parameter<T>> = params
                .iter()
                .copied()
                .filter(|p| self.group_of(p.name()) == Some(name.as_str()))
                .collect();
            opt.check_state(&mine)?;
        }
        Ok(())
    }

    /// The learning rate of the first group (0 with none).
    fn learning_rate(&self) -> f64 {
        self.groups
            .first()
            .map_or(0.0, |(_, _, o)| o.learning_rate())
    }

    /// Sets the learning rate of every group.
    fn set_learning_rate(&mut self, lr: f64) -> Result<()> {
        for (_, _, opt) in &mut self.groups {
            opt.set_learning_rate(lr)?;
        }
        Ok(())
    }
}

impl<T: Real> ParamGroups<T> {
    /// Restores state saved by [`Optimizer::state`] without the checks of
    /// [`Optimizer::load_state`] (used to roll back).
    fn load_state_unchecked(&mut self, entries: Vec<(String, StateValue<T>)>) -> Result<()> {
        let mut per: Vec<Vec<(String, StateValue<T>)>> =
            self.groups.iter().map(|_| Vec::new()).collect();
        for (entry, value) in entries {
            if let Some((group, rest)) = entry.split_once('.')
                && let Some(k) = self.groups.iter().position(|(n, _, _)| n == group)
            {
                per[k].push((rest.to_string(), value));
            }
        }
        for (k, entries) in per.into_iter().enumerate() {
            self.groups[k].2.load_state(entries)?;
        }
        Ok(())
    }
}
