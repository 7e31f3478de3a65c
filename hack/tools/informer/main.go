// Command informer runs a client-go dynamic informer on podimagepulls
// (subresources.aggapi.io/v1alpha1) through kube-apiserver, as controllers and
// dashboards built on aggapi do, so that a test can compare what it ends up caching with
// a fresh list (issue 36: "Correctness under routing"). Built by
// hack/build-binaries.sh informer.
//
// Usage: informer -kubeconfig FILE [-namespace NS] [-selector LABELS]
//
// It reads commands from stdin, one per line, and exits at EOF:
//
//	dump  print the cache, one JSON object a line ({"kind":"Object",...}, sorted by
//	      namespace/name), then {"kind":"Counts",...}: events handled, the list and
//	      watch requests sent, the errors that ended a list or watch, and whether the
//	      cache has synced
//
// SIGUSR1 dumps too. Client-go's defaults are kept (watch-list streaming on, as
// KUBE_FEATURE_WatchListClient decides; KUBE_FEATURE_WatchListClient=false gives the
// classic list, then watch).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

var gvr = schema.GroupVersionResource{
	Group: "subresources.aggapi.io", Version: "v1alpha1", Resource: "podimagepulls"}

// counts are what a test needs to judge a run beyond the cache itself: how often the
// informer had to start over (a list, or a watch-list stream, after an error or a 410).
type counts struct {
	Adds, Updates, Deletes atomic.Int64
	Lists, Watches         atomic.Int64 // requests sent (a watch-list stream is a watch)
	InitialStreams         atomic.Int64 // watches with sendInitialEvents=true
	WatchErrors, Expired   atomic.Int64 // errors that ended ListAndWatch; 410s among them
}

// countingTransport counts the list and watch requests the reflector sends.
type countingTransport struct {
	next http.RoundTripper
	c    *counts
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	switch {
	case q.Get("watch") == "true" || q.Get("watch") == "1":
		t.c.Watches.Add(1)
		if q.Get("sendInitialEvents") == "true" {
			t.c.InitialStreams.Add(1)
		}
	case req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/"+gvr.Resource):
		t.c.Lists.Add(1)
	}
	return t.next.RoundTrip(req)
}

// object is one cached PodImagePull as the test compares it: identity, version, phases.
type object struct {
	Kind            string            `json:"kind"`
	Namespace       string            `json:"namespace"`
	Name            string            `json:"name"`
	UID             string            `json:"uid"`
	ResourceVersion string            `json:"resourceVersion"`
	Phase           string            `json:"phase"`
	Images          []map[string]any  `json:"images"`
	Labels          map[string]string `json:"labels,omitempty"`
}

func toObject(u *unstructured.Unstructured) object {
	o := object{Kind: "Object", Namespace: u.GetNamespace(), Name: u.GetName(),
		UID: string(u.GetUID()), ResourceVersion: u.GetResourceVersion(), Labels: u.GetLabels()}
	o.Phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
	images, _, _ := unstructured.NestedSlice(u.Object, "status", "images")
	o.Images = []map[string]any{}
	for _, i := range images {
		if m, ok := i.(map[string]any); ok {
			o.Images = append(o.Images, map[string]any{
				"container": m["container"], "image": m["image"], "phase": m["phase"]})
		}
	}
	return o
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster (kube-apiserver)")
	namespace := flag.String("namespace", metav1.NamespaceAll, "one namespace; all when empty")
	selector := flag.String("selector", "", "label selector")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err)
	}
	var c counts
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &c} })
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}

	// No resync: every event counted is one the server sent.
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 0, *namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = *selector })
	informer := factory.ForResource(gvr).Informer()
	// The reflector calls this each time a list or watch ends in error, before it starts
	// over; a 410 (Expired/Gone) means the server could not continue from our version.
	err = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		c.WatchErrors.Add(1)
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			c.Expired.Add(1)
		}
		fmt.Fprintf(os.Stderr, "informer: watch error: %v\n", err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	if err != nil {
		fail(err)
	}
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.Adds.Add(1) },
		UpdateFunc: func(any, any) { c.Updates.Add(1) },
		DeleteFunc: func(any) { c.Deletes.Add(1) },
	})
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())

	var mu sync.Mutex // one dump at a time on stdout
	out := bufio.NewWriter(os.Stdout)
	dump := func() {
		mu.Lock()
		defer mu.Unlock()
		var objs []object
		for _, item := range informer.GetStore().List() {
			if u, ok := item.(*unstructured.Unstructured); ok {
				objs = append(objs, toObject(u))
			}
		}
		sort.Slice(objs, func(i, j int) bool {
			return objs[i].Namespace+"/"+objs[i].Name < objs[j].Namespace+"/"+objs[j].Name
		})
		enc := json.NewEncoder(out)
		for _, o := range objs {
			_ = enc.Encode(o)
		}
		_ = enc.Encode(map[string]any{
			"kind":                    "Counts",
			"synced":                  informer.HasSynced(),
			"objects":                 len(objs),
			"lastSyncResourceVersion": informer.LastSyncResourceVersion(),
			"adds":                    c.Adds.Load(),
			"updates":                 c.Updates.Load(),
			"deletes":                 c.Deletes.Load(),
			"lists":                   c.Lists.Load(),
			"watches":                 c.Watches.Load(),
			"initialStreams":          c.InitialStreams.Load(),
			"watchErrors":             c.WatchErrors.Load(),
			"expired":                 c.Expired.Load(),
		})
		_ = out.Flush()
	}

	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			dump()
		}
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "dump":
			dump()
		case "":
		default:
			fmt.Fprintf(os.Stderr, "informer: unknown command %q (dump)\n", in.Text())
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "informer: %v\n", err)
	os.Exit(1)
}
