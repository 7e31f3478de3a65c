// Command kubectl is kubectl of the oldest release the README claims for the plugins
// (KUBECTL_OLDEST_VERSION in ../versions.env), built by hack/build-binaries.sh
// kubectl-oldest. Its main package lives in k8s.io/kubernetes, whose staging modules of
// that release the module proxy does not serve, so this calls the k8s.io/kubectl module's
// command directly.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	// As kubectl's own main: errors are printed kubectl's way, with its exit codes.
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
