//! [`PerStage`]: one value per stage, keyed by the stage's name.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One value per stage, in stage-id order, each with its stage's name.
///
/// In JSON it is an object keyed by stage name, in stage-id order:
/// `{"parse": 0.8, "plan": 0.1}` (report schema 2). A report of schema 1
/// wrote a bare array indexed by stage id; it reads with the names `"0"`,
/// `"1"`, …, which [`crate::Report::read`] replaces with the report's
/// stage names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerStage<T>(pub Vec<(String, T)>);

impl<T> PerStage<T> {
    /// Pairs `names` with `values` (the shorter one sets the length).
    pub fn zip(names: &[String], values: impl IntoIterator<Item = T>) -> Self {
        Self(names.iter().cloned().zip(values).collect())
    }

    /// The value of stage `name`.
    pub fn get(&self, name: &str) -> Option<&T> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The values in stage-id order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|(_, v)| v)
    }

    /// The names in stage-id order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    /// How many stages.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no stage (before the guest registered).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes on the heap (names and the pairs), for bounded buffers.
    pub fn heap_bytes(&self) -> usize {
        self.0.capacity() * std::mem::size_of::<(String, T)>()
            + self.0.iter().map(|(n, _)| n.capacity()).sum::<usize>()
    }

    /// Replaces index names (`"0"`, `"1"`, … of a schema-1 report) by
    /// `names[i]`; other names stay.
    pub(crate) fn name_indices(&mut self, names: &[String]) {
        for (n, _) in &mut self.0 {
            if let Some(real) = n.parse::<usize>().ok().and_then(|i| names.get(i)) {
                n.clone_from(real);
            }
        }
    }
}

impl<T: Serialize> Serialize for PerStage<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for PerStage<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = PerStage<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object keyed by stage name (or a schema-1 array)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry()? {
                    out.push((k, v));
                }
                Ok(PerStage(out))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = s.next_element()? {
                    out.push((out.len().to_string(), v));
                }
                Ok(PerStage(out))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_keyed_by_name_in_stage_order() {
        let names = ["parse".to_string(), "plan".into(), "execute".into()];
        let p = PerStage::zip(&names, [0.5, 0.25, 1.0]);
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"parse":0.5,"plan":0.25,"execute":1.0}"#);
        let back: PerStage<f64> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.get("plan"), Some(&0.25));
        assert_eq!(
            back.names().collect::<Vec<_>>(),
            ["parse", "plan", "execute"]
        );
    }

    #[test]
    fn a_schema_1_array_reads_by_index_and_takes_the_names() {
        let mut old: PerStage<usize> = serde_json::from_str("[1, 0, 1]").unwrap();
        assert_eq!(old.names().collect::<Vec<_>>(), ["0", "1", "2"]);
        old.name_indices(&["a".into(), "b".into(), "c".into()]);
        assert_eq!(old.get("c"), Some(&1));
        assert_eq!(old.values().sum::<usize>(), 2);
    }
}
