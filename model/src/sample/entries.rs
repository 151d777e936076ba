//! Serde `with` functions for such maps: `#[serde(with = "entries")]`.

use std::collections::BTreeMap;

use serde::de::{Deserialize, Deserializer};
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

pub fn serialize<S, K, V>(map: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    K: Serialize,
    V: Serialize,
{
    let mut seq = s.serialize_seq(Some(map.len()))?;
    for entry in map {
        seq.serialize_element(&entry)?;
    }
    seq.end()
}

pub fn deserialize<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
{
    Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
}
