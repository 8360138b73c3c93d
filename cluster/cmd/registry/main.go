// Command registry is the distribution registry with its filesystem storage only.
//
// Images built here are pushed to it on loopback and containerd on the real nodes pulls from it
// in place of docker.io, ghcr.io and nvcr.io, so the bundled runtimes' image names and pull
// policies work unchanged. The upstream main also links the S3, Azure and GCS drivers, which a
// registry with no route off the machine cannot use.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
