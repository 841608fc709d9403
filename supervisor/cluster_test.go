package supervisor

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/exo-pd/exo-pd/supervisor/config"
)

// /exo/cluster names the host this supervisor runs as: `exo doctor` tells
// a peer's answer from another supervisor's holding its address by it.
func TestServeClusterNamesItsHost(t *testing.T) {
	c := &config.Config{}
	c.Cluster.Name = "lab"
	s := &supervisor{host: "south", cfg: c, digest: "d1"}
	rec := httptest.NewRecorder()
	s.serveCluster(rec, httptest.NewRequest("GET", ClusterPath, nil))
	var info ClusterInfo
	if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	if info.Host != "south" || info.Cluster != "lab" || info.Digest != "d1" || info.Time.IsZero() {
		t.Errorf("cluster info %+v", info)
	}
}
