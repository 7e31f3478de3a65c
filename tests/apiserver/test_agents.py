from aggapi.apiserver.agents import endpoints_from_slice


def test_only_ready_endpoints_with_node_names() -> None:
    es = {
        "ports": [{"name": "https", "port": 10443}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "nodeName": "a", "conditions": {"ready": True}},
            {"addresses": ["10.0.0.2"], "nodeName": "b", "conditions": {"ready": False}},
            {"addresses": ["10.0.0.3"], "nodeName": "c", "conditions": {}},
            {"addresses": ["10.0.0.4"], "conditions": {"ready": True}},
            {"addresses": ["10.0.0.5"], "nodeName": "e",
             "conditions": {"ready": True, "terminating": True}},
        ],
    }
    eps = endpoints_from_slice(es, "https")
    assert [(e.node, e.url) for e in eps] == [("a", "https://10.0.0.1:10443"),
                                              ("c", "https://10.0.0.3:10443")]


def test_port_by_name_and_ipv6() -> None:
    es = {"ports": [{"name": "metrics", "port": 9090}, {"name": "https", "port": 1}],
          "endpoints": [{"addresses": ["fd00::1"], "nodeName": "a"}]}
    assert endpoints_from_slice(es, "https")[0].url == "https://[fd00::1]:1"
    assert endpoints_from_slice(es, "grpc") == []
