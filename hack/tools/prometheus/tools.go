//go:build tools

// Package tools pins github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool for hack/build-binaries.sh.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
import _ "github.com/prometheus/prometheus/cmd/promtool"
