//! The ebbflow operator: controller, bidder, markets, provisioners and the simulator.
