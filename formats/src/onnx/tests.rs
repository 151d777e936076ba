use super::proto::*;
use super::*;

fn raw(name: &str, data_type: i32, dims: &[i64], data: Vec<u8>) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type,
        dims: dims.to_vec(),
        raw_data: data,
        ..Default::default()
    }
}

fn model(init: Vec<TensorProto>) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        producer_name: "test".into(),
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into(), "w".into()],
                output: vec!["y".into()],
                name: "mm".into(),
                op_type: "MatMul".into(),
                attribute: Vec::new(),
            }],
            name: "g".into(),
            initializer: init,
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
    }
    .encode_to_vec()
}

fn find(hay: &[u8], needle: &[u8]) -> u64 {
    hay.windows(needle.len()).position(|w| w == needle).unwrap() as u64
}

#[test]
fn raw_and_packed_float_tensors_at_their_offsets() {
    let w: Vec<u8> = (0..24).collect();
    let f = TensorProto {
        name: "f".into(),
        data_type: 1,
        dims: vec![2],
        float_data: vec![1.5, -2.0],
        ..Default::default()
    };
    let file = model(vec![raw("w", 10, &[3, 4], w.clone()), f]);
    let c = parse(&file).unwrap();
    assert_eq!(c.format, Format::Onnx);
    assert_eq!(c.tensors.len(), 2);
    let t = c.tensors.iter().find(|t| t.name == "w").unwrap();
    assert_eq!((t.dtype.clone(), t.shape.clone()), (Dtype::F16, vec![3, 4]));
    assert_eq!((t.offset, t.len), (find(&file, &w), 24));
    let mut fl = 1.5f32.to_le_bytes().to_vec();
    fl.extend((-2.0f32).to_le_bytes());
    let t = c.tensors.iter().find(|t| t.name == "f").unwrap();
    assert_eq!((t.offset, t.len), (find(&file, &fl), 8));
}

/// Weights in a `Constant` node (its value unnamed, as exporters write it) and in the
/// initializers of an `If` branch, nested in another `If` (silero_vad keeps its weights so):
/// tensors of the file at their offsets, named after the node's output where unnamed.
#[test]
fn constant_nodes_and_subgraph_initializers_are_tensors() {
    let c1: Vec<u8> = (0..32).collect();
    let s1: Vec<u8> = (100..164).collect();
    let s2: Vec<u8> = (200..216).collect();
    let attr = |name: &str| AttributeProto {
        name: name.into(),
        ..Default::default()
    };
    let inner = GraphProto {
        name: "inner".into(),
        initializer: vec![raw("deep", 1, &[4], s2.clone())],
        ..Default::default()
    };
    let branch = GraphProto {
        name: "then".into(),
        node: vec![NodeProto {
            output: vec!["z".into()],
            op_type: "If".into(),
            attribute: vec![AttributeProto {
                g: Some(inner.clone()),
                ..attr("then_branch")
            }],
            ..Default::default()
        }],
        initializer: vec![raw("sub", 1, &[16], s1.clone())],
    };
    let nodes = vec![
        NodeProto {
            output: vec!["k".into()],
            op_type: "Constant".into(),
            attribute: vec![AttributeProto {
                t: Some(raw("", 1, &[8], c1.clone())),
                ..attr("value")
            }],
            ..Default::default()
        },
        NodeProto {
            output: vec!["y".into()],
            op_type: "If".into(),
            attribute: vec![
                AttributeProto {
                    g: Some(branch),
                    ..attr("then_branch")
                },
                AttributeProto {
                    graphs: vec![inner],
                    ..attr("else_branch")
                },
            ],
            ..Default::default()
        },
    ];
    let file = ModelProto {
        ir_version: 8,
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: vec![raw("w", 1, &[2], vec![1; 8])],
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let c = parse(&file).unwrap();
    let mut got: Vec<(String, u64, u64)> = c
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.offset, t.len))
        .collect();
    got.sort();
    let deep = find(&file, &s2);
    let second = deep
        + 1
        + file[deep as usize + 1..]
            .windows(16)
            .position(|w| w == s2.as_slice())
            .unwrap() as u64;
    let want = vec![
        ("deep".to_string(), deep, 16),
        ("deep".to_string(), second, 16),
        ("k".to_string(), find(&file, &c1), 32),
        ("sub".to_string(), find(&file, &s1), 64),
        ("w".to_string(), find(&file, &[1; 8]), 8),
    ];
    assert_eq!(got, want);
}

#[test]
fn varint_data_is_unmapped_and_external_data_listed() {
    let i = TensorProto {
        name: "i".into(),
        data_type: 7,
        dims: vec![3],
        int64_data: vec![1, 2, 3],
        ..Default::default()
    };
    let entry = |k: &str, v: &str| StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    };
    let e = TensorProto {
        name: "e".into(),
        data_type: 1,
        dims: vec![4, 4],
        data_location: DataLocation::External as i32,
        external_data: vec![entry("location", "w.bin"), entry("offset", "4096")],
        ..Default::default()
    };
    let c = parse(&model(vec![i, e])).unwrap();
    assert!(c.tensors.is_empty());
    assert_eq!(c.unmapped.len(), 1);
    assert_eq!(c.unmapped[0].storage, "int64_data (varints)");
    assert_eq!(c.external.len(), 1);
    let x = &c.external[0];
    assert_eq!((x.location.as_str(), x.offset, x.len), ("w.bin", 4096, 64));
}

#[test]
fn bad_initializers_are_errors() {
    let err = |t: TensorProto| parse(&model(vec![t])).unwrap_err().to_string();
    assert!(err(raw("", 1, &[1], vec![0; 4])).contains("has no name"));
    assert!(err(raw("a", 0, &[1], vec![0; 4])).contains("unknown dtype 'UNDEFINED'"));
    assert!(err(raw("a", 1, &[-1], vec![0; 4])).contains("negative dimension"));
    assert!(err(raw("a", 1, &[3], vec![0; 4])).contains("needs '12' bytes but it spans '4'"));
    assert!(err(raw("a", 1, &[1 << 40, 1 << 40], vec![0; 4])).contains("overflows"));
    let mut t = raw("a", 1, &[1], vec![]);
    t.data_location = DataLocation::External as i32;
    assert!(err(t).contains("has no 'location'"));
}

#[test]
fn sniff_and_detect_are_strict() {
    assert!(!sniff(b"\x08"));
    assert!(!sniff(b"\x08\x00"));
    assert!(!sniff(b"\x08\xc8\x01"));
    assert!(sniff(b"\x08\x08"));
    // ir_version but no graph; a graph but trailing garbage.
    assert_eq!(detect(&b"\x08\x08".to_vec()).unwrap(), None);
    let mut f = model(vec![]);
    assert!(detect(&f).unwrap().is_some());
    f.push(0x0b);
    assert_eq!(detect(&f).unwrap(), None);
    // A known field with the wrong wire type.
    let mut f = b"\x08\x08\x3d\0\0\0\0".to_vec();
    f.extend(model(vec![]).get(2..).unwrap());
    assert_eq!(detect(&f).unwrap(), None);
}
