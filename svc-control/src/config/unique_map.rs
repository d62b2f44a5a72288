//! A string-keyed map that refuses duplicate keys (serde's maps keep the last one silently).

use std::{borrow::Cow, collections::BTreeMap, fmt, marker::PhantomData};

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{
    Deserialize, Deserializer, Serialize,
    de::{MapAccess, Visitor},
};

/// An ordered map from names to `V`; a repeated key is a parse error naming it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct UniqueMap<V>(pub BTreeMap<String, V>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UniqueVisitor<V>(PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for UniqueVisitor<V> {
            type Value = UniqueMap<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map with unique keys")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = BTreeMap::new();
                while let Some(key) = access.next_key::<String>()? {
                    if map.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
                    }
                    let value = access.next_value::<V>()?;
                    map.insert(key, value);
                }
                Ok(UniqueMap(map))
            }
        }

        deserializer.deserialize_map(UniqueVisitor(PhantomData))
    }
}

impl<V: JsonSchema> JsonSchema for UniqueMap<V> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        BTreeMap::<String, V>::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        BTreeMap::<String, V>::json_schema(generator)
    }
}
