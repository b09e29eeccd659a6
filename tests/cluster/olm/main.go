// olm-validate: the operator framework's own validators (github.com/operator-framework/api)
// on an OLM bundle directory, as `operator-sdk bundle validate` runs them: the default bundle
// validators, OperatorHub's (v2) and the good practices. One line per finding,
// "ERROR <validator>: <message>" or "WARNING ..."; exit 1 on an error, 2 if the bundle
// cannot be read. Built by tests/cluster/olm-deps.sh.
package main

import (
	"fmt"
	"os"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: olm-validate BUNDLE_DIR")
		os.Exit(2)
	}
	b, err := manifests.GetBundleFromDir(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	objs := b.ObjectsToValidate()
	objs = append(objs, map[string]string{"k8s-version": "1.36"})
	failed := false
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator, validation.GoodPracticesValidator)
	for _, r := range validators.Validate(objs...) {
		for _, e := range r.Errors {
			failed = true
			fmt.Printf("ERROR %s: %s\n", r.Name, e.Error())
		}
		for _, w := range r.Warnings {
			fmt.Printf("WARNING %s: %s\n", r.Name, w.Error())
		}
	}
	if failed {
		os.Exit(1)
	}
}
